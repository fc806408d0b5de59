"""The `dsparklab` command line."""
