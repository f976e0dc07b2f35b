"""nodecert check suite: proves a GPU node is fit to train, or says exactly what is wrong."""

__version__ = "0.1.0"
