"""pytorch-ignite's Engine, Events and ModelCheckpoint, as far as the fixtures use them (ignite 0.1's API)."""
