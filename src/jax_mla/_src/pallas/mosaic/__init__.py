"""The Mosaic GPU (Hopper) decode kernel."""
