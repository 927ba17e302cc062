"""verl-gdro: Multi-Adversary Group DRO (Prompt-GDRO, Rollout-GDRO) for verl 0.9.1."""

from setuptools import find_packages, setup

setup(
    name="verl-gdro",
    version="0.1.0",
    description=(
        "Online difficulty classifier, Prompt-GDRO and Rollout-GDRO (arXiv 2601.19280) "
        "as verl 0.9.1 components"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["verl_gdro", "verl_gdro.*"]),
    package_data={"verl_gdro": ["config/*.yaml", "config/**/*.yaml"]},
    include_package_data=True,
    # The controllers need numpy only; the verl glue needs verl 0.9.1 (install torch first:
    # on CPU machines `pip install torch==2.13.0` before this package, see the Makefile).
    install_requires=["numpy>=1.24"],
    extras_require={
        "verl": ["verl[verl-core]==0.9.1"],
        "plot": ["matplotlib>=3.7"],
        "test": [
            "pytest>=7",
            "hypothesis>=6.100",
            "ruff>=0.6",
            "matplotlib>=3.7",
            "pandas>=2",
            "pyarrow>=14",
            "math-verify==0.9.0",
        ],
    },
    entry_points={
        "verl.plugins": ["verl_gdro = verl_gdro.integration.plugin"],
        "console_scripts": ["verl-gdro = verl_gdro.cli:main"],
    },
)
