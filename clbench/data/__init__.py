"""Streams and their data: Avalanche scenarios with the harness's metadata, datasets and loaders,
the check of a dataset on disk, miniature fixtures in official layouts, the offline tokenizer."""
