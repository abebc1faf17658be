"""kbframe: a declarative, Hydra-config-driven simulator of AI-accelerator PEs and the
kernels that run on them. See README.md and DESIGN.md."""

__version__ = "0.1.0"
