"""End-to-end scenarios and the local cluster they can run on."""
