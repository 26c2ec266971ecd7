"""The report's sections beyond the effects: pools, ranks, predictions, learning runs, published figures."""
