"""harness: measuring attention variants (cost, accuracy), storing results, plotting them."""
