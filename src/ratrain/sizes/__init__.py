"""Bytes of the training states (weights, optimizer states, views, gradients, activations, step workspace); pure, below the schedule IR."""
