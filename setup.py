"""Setuptools shim; the package metadata lives in setup.cfg."""

from setuptools import setup

setup()
