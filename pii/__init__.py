"""Personal-data detection and masking: the detector, its validators and learned token models."""
