"""tfrbeam packaging. Dataflow workers install from this file via --setup_file, so it must build from an sdist."""

import pathlib
import re

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "tfrbeam" / "__init__.py").read_text()).group(1)

setup(
    name="tfrbeam",
    version=VERSION,
    description="TensorFlow-free TFRecord / tf.train.Example codec, Apache Beam IO and dataset builds",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["tfrbeam", "tfrbeam.*"]),
    package_data={"tfrbeam.protos": ["*.proto"]},
    include_package_data=True,
    install_requires=[
        "apache-beam>=2.60",
        # Generated protobuf modules carry no runtime version check and work on 4.25 to 6.x.
        "protobuf>=4.25,<7",
        "crc32c>=2.3",
        # XXH3 output is frozen from xxHash 0.8.0, bundled from python-xxhash 2.0 on: the content hash of the shuffle.
        "xxhash>=2.0",
        "pyarrow>=14",
        "numpy>=1.24",
        "PyYAML>=6",
        # The build's progress bar on a terminal (rate, ETA, terminal width); pure Python, no dependencies.
        "tqdm>=4.66",
    ],
    extras_require={
        "test": [
            "pytest>=7",
            "hypothesis>=6.80",
            "pytest-xdist>=3",
            "apache-beam[gcp]>=2.60",
        ],
        # Optional: the PyTorch adapter of tfrbeam.dataset (tfrbeam.dataset.torch).
        "torch": ["torch>=2.0"],
    },
    entry_points={"console_scripts": ["tfrbeam=tfrbeam.cli:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
