"""The ``tarindex`` command line (click). Imports nothing heavy at start-up."""
