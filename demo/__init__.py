"""The demo's raw-data builder and its ground-truth evaluation: not part of the product."""
