"""Many simulations: capacity search (`capacity`), concurrency sweeps (`sweep`), the throughput /
interactivity frontier (`frontier`), A/B reports and figures, where simulations run (`executor`),
GPU prices and the progress bar."""
