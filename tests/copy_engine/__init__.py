"""The three copy-engine entry points and the cudaMemcpyBatchAsync routes behind them."""
