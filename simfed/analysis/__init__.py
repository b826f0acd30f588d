"""Reading simulation results: tables, explanations, JSON and trace output."""
