"""The continual loop on Lightning: the runner, the LightningModule that wraps model, strategy and
objective, one stage of training and what an evaluation pass returns, the Trainer, the loop's
state and checkpoints between experiences, sharding, logging and the run folder."""
