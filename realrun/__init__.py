"""realrun: FSDP, HSDP, FL+FSDP and FL+HSDP for real with PyTorch, tracing in simfed's schema.

Modules: cli (`realrun run`), launch (torchrun on one host, failure diagnosis), train (the
torchrun entry point and the training step), mesh (DeviceMesh and process groups from the plan),
model (Llama), sharding (FSDP2 wrapping), optimizer (AdamW, LR schedule), fedavg (FedAvg),
data (synthetic corpus with an entropy floor, token/text files, sampler), collectives
(per-collective spans), tracing (clock, step and phase spans), summary (summary.json,
Chrome trace), config (torch-free option parsing), errors (one-line failures and exit codes).
Imports nothing from simfed but `simfed.spec`.
"""

__version__ = "0.1.0"
