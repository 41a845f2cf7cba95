"""The quick-start demo: a log directory in Kafka's format, produced to and consumed from.

Run ``python -m seglogfs.demo [LOGDIR]``. Without LOGDIR a temporary directory is used
and removed afterwards. (The FUSE mount that turns this into files for ``echo`` and
``tail -f`` is the next piece of work; this demo drives the storage engine directly.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from storage import LogManager, partition_for_key


def run(log_dir: Path) -> None:
    print(f"log directory: {log_dir}")
    with LogManager.open(log_dir) as manager:
        if "orders" not in manager.topics():
            manager.create_topic("orders", 3, {"segment.bytes": "1024"}, key_separator=":")
        print("topics:", ", ".join(manager.topics()))

        lines = [f"customer-{i % 7}:order {i} for {10 + i} EUR" for i in range(60)]
        print(f"\nproduce {len(lines)} keyed lines (partition = murmur2(key) % 3, as Kafka)")
        for line in lines:
            key, _, value = line.partition(":")
            partition = partition_for_key(key.encode(), 3)
            manager.log("orders", partition).append([value.encode()], keys=[key.encode()])

        print("\nconsume partition 0 from offset 0:")
        for record in manager.log("orders", 0).read(0, 5):
            key = record.key.decode() if record.key else ""
            value = record.value.decode() if record.value else ""
            print(f"  offset {record.offset}: {key}:{value}")
        print("  ...")

        print("\npartitions:")
        for description in manager.describe_topic("orders").partitions:
            print(
                f"  orders-{description.partition}: offsets "
                f"[{description.log_start_offset}, {description.log_end_offset}), "
                f"{description.segment_count} segment(s), {description.size} bytes"
            )
    print("\nfiles (Kafka's on-disk layout):")
    for path in sorted((log_dir / "orders-0").iterdir()):
        print(f"  orders-0/{path.name}  {path.stat().st_size} bytes")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log_dir", nargs="?", type=Path, help="log directory to use")
    args = parser.parse_args(argv)
    if args.log_dir is not None:
        run(args.log_dir)
        return 0
    with tempfile.TemporaryDirectory(prefix="seglog-demo-") as tmp:
        run(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
