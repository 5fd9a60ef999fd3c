"""Adapters for inference engines that size buffers or call index builders their own way."""
