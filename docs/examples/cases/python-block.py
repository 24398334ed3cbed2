"""Word counts for a text file."""

import sys
from collections import Counter


def count_words(path: str) -> Counter:
    counts = Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            ‸


def main() -> None:
    for word, n in count_words(sys.argv[1]).most_common(10):
        print(f"{n:6d} {word}")


if __name__ == "__main__":
    main()
