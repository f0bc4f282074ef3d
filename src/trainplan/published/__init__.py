"""The open published tables (package data) mapped to specs, predicted against, and the per-generation efficiency fit."""
