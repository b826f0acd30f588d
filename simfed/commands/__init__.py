"""Subcommands of `simfed` that live apart from `simfed.cli` (the group, the error contract and
the smaller commands): each a thin layer over `simfed.api`."""
