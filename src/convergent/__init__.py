"""convergent: training Transformers whose training dynamics you can trust."""

__version__ = "0.1.0"
