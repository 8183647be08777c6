"""convergent: training Transformers whose training dynamics you can trust."""

from convergent.registration import install as _install_transformers_reader

__version__ = "0.1.0"

_install_transformers_reader()  # transformers' from_pretrained then reads compressed folders
