"""Supervised fine-tuning: data (`data.py`) and the training loop (`train.py`)."""
