"""What the composition root (`trainer.build`) assembles: models, optimizers, precision,
steps, exact evaluation, checkpoint files, torch.compile, batches as trees."""
