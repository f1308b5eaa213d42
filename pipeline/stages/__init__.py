"""Build stages in order: download -> calibrate -> compile -> package; `build` runs them."""
