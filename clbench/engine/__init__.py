"""The continual loop on Lightning: the runner, the LightningModule that wraps model, strategy and
objective, the Trainer, checkpoints between experiences, sharding, logging and the run folder."""
