"""PIL, as far as the fixtures use it (``PIL.Image``)."""
