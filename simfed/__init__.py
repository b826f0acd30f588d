"""simfed: a discrete-event model of FSDP, HSDP, FL+FSDP and FL+HSDP on GPU clusters."""

__version__ = "0.1.0"
