"""dsparklab: per-position traces of DSpark and Eagle3 speculative decoding."""

__version__ = "0.1.0"
