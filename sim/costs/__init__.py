"""Calibration profiles and the compute cost models (fixed, roofline, calibrated)."""
