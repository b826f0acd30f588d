"""realrun: FSDP, HSDP, FL+FSDP and FL+HSDP for real with PyTorch, tracing in simfed's schema."""

__version__ = "0.1.0"
