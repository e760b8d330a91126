"""Predicted against published runs."""
