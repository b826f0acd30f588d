"""The fuzzer of simfed's input contract: `python -m tests.fuzz --cases 5000` (see __main__)."""
