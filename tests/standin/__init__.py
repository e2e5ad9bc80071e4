"""The stand-in trainer (trainer.py): a script the capture docs and fixtures run, kept out of the
product package."""
