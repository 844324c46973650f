"""Tools built on the loader: the demo (and, later, the command line)."""
