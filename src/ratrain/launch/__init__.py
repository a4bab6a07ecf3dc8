"""Process launch: process groups and the rank grid, spawning, faults, host memory."""
