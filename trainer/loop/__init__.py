"""The training loop and its policies: the `Trainer`, what follows each step (report,
agree, save), the save policy, the progress and the checkpoint's contents."""
