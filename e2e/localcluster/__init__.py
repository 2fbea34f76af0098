"""An executing local cluster for tests: an emulated API server, controllers and a kubelet."""
