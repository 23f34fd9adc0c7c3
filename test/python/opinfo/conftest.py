import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "opinfo: runs PyTorch's OpInfo database through backend='tpu'")
