"""The NumPy trainer: the model's forward and backward by hand (model.py), its optimizers (optim.py)."""
