"""Running ranks: `ddp-trainer run`'s local launcher, what one rank does (train, evaluate)
and its lifecycle, which failure is the cause, outputs, and resume checks."""
