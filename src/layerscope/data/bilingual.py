"""Deterministic Chinese-English pairs of math word problems.

Every pair is one problem written twice, once in English and once in Chinese,
with the same numbers, names and objects, and the answer computed from those
numbers. Five categories: ``arithmetic``, ``combinations``, ``remainders``,
``rectangle_area`` and ``arithmetic_series``; several phrasings per category.
``generate_pairs(n, seed)`` is a pure function of ``(n, seed)``: the same call
gives the same pairs on any machine (Python's ``random.Random`` is specified
to be reproducible across platforms and versions for a given seed).

Categories are interleaved (pair i belongs to category ``i % 5``), so any
prefix of the list is balanced.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass
from typing import Callable

from layerscope.errors import InputError

__all__ = ["BilingualPair", "CATEGORIES", "generate_pairs", "GENERATORS"]

# (English, Chinese) names.
NAMES = (
    ("Xiao Ming", "小明"), ("Li Hua", "李华"), ("Wang Fang", "王芳"), ("Zhang Wei", "张伟"),
    ("Chen Jing", "陈静"), ("Liu Yang", "刘洋"), ("Zhao Lei", "赵磊"), ("Sun Li", "孙丽"),
    ("Zhou Tao", "周涛"), ("Wu Min", "吴敏"), ("Huang Lan", "黄兰"), ("Lin Feng", "林峰"),
)
# (English plural, Chinese noun, Chinese measure word).
OBJECTS = (
    ("apples", "苹果", "个"), ("books", "书", "本"), ("pencils", "铅笔", "支"), ("stamps", "邮票", "张"),
    ("marbles", "弹珠", "颗"), ("oranges", "橙子", "个"), ("cards", "卡片", "张"), ("stickers", "贴纸", "张"),
    ("eggs", "鸡蛋", "个"), ("flowers", "花", "朵"),
)
# (English plural, Chinese noun) for groups chosen from.
PEOPLE = (("students", "学生"), ("players", "队员"), ("teachers", "老师"), ("volunteers", "志愿者"),
          ("workers", "工人"), ("children", "孩子"))
# (English, Chinese) for pairs of menus in the counting problems.
MENUS = (
    (("shirts", "件衬衫"), ("pairs of trousers", "条裤子"), "outfits", "搭配"),
    (("main dishes", "种主菜"), ("desserts", "种甜点"), "meals", "套餐"),
    (("hats", "顶帽子"), ("scarves", "条围巾"), "combinations", "组合"),
)
UNITS = (("cm", "厘米"), ("m", "米"), ("mm", "毫米"))


@dataclass(frozen=True)
class BilingualPair:
    id: str
    source: str  # Chinese
    target: str  # English
    category: str
    answer: int

    def to_dict(self) -> dict:
        return asdict(self)


def _pick(rng: random.Random, seq):
    return seq[rng.randrange(len(seq))]


def _arithmetic(rng: random.Random) -> tuple[str, str, int]:
    (en, zh) = _pick(rng, NAMES)
    obj_en, obj_zh, mw = _pick(rng, OBJECTS)
    form = rng.randrange(3)
    if form == 0:
        a, b = rng.randint(3, 90), rng.randint(2, 60)
        return (f"{zh}有{a}{mw}{obj_zh}，又买了{b}{mw}。{zh}现在一共有多少{mw}{obj_zh}？",
                f"{en} has {a} {obj_en} and buys {b} more. How many {obj_en} does {en} have now?", a + b)
    if form == 1:
        a = rng.randint(20, 120)
        b = rng.randint(1, a - 1)
        return (f"{zh}有{a}{mw}{obj_zh}，送给朋友{b}{mw}后，还剩多少{mw}？",
                f"{en} had {a} {obj_en} and gave {b} of them to a friend. How many {obj_en} are left?", a - b)
    a, b = rng.randint(2, 12), rng.randint(3, 25)
    return (f"每个盒子里有{b}{mw}{obj_zh}，{zh}买了{a}个盒子，一共有多少{mw}{obj_zh}？",
            f"Each box holds {b} {obj_en}. {en} buys {a} boxes. How many {obj_en} is that in total?", a * b)


def _combinations(rng: random.Random) -> tuple[str, str, int]:
    if rng.randrange(2) == 0:
        people_en, people_zh = _pick(rng, PEOPLE)
        n = rng.randint(5, 20)
        k = rng.randint(2, min(5, n - 1))
        return (f"从{n}名{people_zh}中选出{k}名组成一个小组，共有多少种不同的选法？",
                f"In how many different ways can a group of {k} be chosen from {n} {people_en}?", math.comb(n, k))
    (a_en, a_zh), (b_en, b_zh), what_en, what_zh = _pick(rng, MENUS)
    (en, zh) = _pick(rng, NAMES)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return (f"{zh}有{a}{a_zh}和{b}{b_zh}，每次各选一个，一共有多少种不同的{what_zh}？",
            f"{en} has {a} {a_en} and {b} {b_en} and picks one of each. How many different "
            f"{what_en} are possible?", a * b)


def _remainders(rng: random.Random) -> tuple[str, str, int]:
    if rng.randrange(2) == 0:
        b = rng.randint(3, 19)
        a = rng.randint(b + 1, 999)
        return (f"{a}除以{b}的余数是多少？", f"What is the remainder when {a} is divided by {b}?", a % b)
    (en, zh) = _pick(rng, NAMES)
    obj_en, obj_zh, mw = _pick(rng, OBJECTS)
    k = rng.randint(3, 12)
    n = rng.randint(k + 1, 150)
    return (f"{zh}把{n}{mw}{obj_zh}平均分给{k}个小朋友，每人分得同样多，最后还剩几{mw}？",
            f"{en} shares {n} {obj_en} equally among {k} children, giving each the same number. "
            f"How many {obj_en} are left over?", n % k)


def _rectangle_area(rng: random.Random) -> tuple[str, str, int]:
    unit_en, unit_zh = _pick(rng, UNITS)
    length = rng.randint(4, 60)
    width = rng.randint(2, length)
    if rng.randrange(2) == 0:
        return (f"一个长方形的长是{length}{unit_zh}，宽是{width}{unit_zh}，它的面积是多少平方{unit_zh}？",
                f"A rectangle is {length} {unit_en} long and {width} {unit_en} wide. What is its area in "
                f"square {unit_en}?", length * width)
    (en, zh) = _pick(rng, NAMES)
    return (f"{zh}家的花园是长方形的，长{length}{unit_zh}，宽{width}{unit_zh}。花园的面积是多少平方{unit_zh}？",
            f"{en}'s garden is a rectangle {length} {unit_en} long and {width} {unit_en} wide. "
            f"What is the area of the garden in square {unit_en}?", length * width)


def _arithmetic_series(rng: random.Random) -> tuple[str, str, int]:
    a, d, n = rng.randint(2, 20), rng.randint(1, 9), rng.randint(5, 30)
    if rng.randrange(2) == 0:
        total = n * a + n * (n - 1) * d // 2
        return (f"一个等差数列的首项是{a}，公差是{d}，求这个数列前{n}项的和。",
                f"An arithmetic sequence starts at {a} with a common difference of {d}. "
                f"Find the sum of its first {n} terms.", total)
    (en, zh) = _pick(rng, NAMES)
    return (f"{zh}第一天读了{a}页书，以后每天比前一天多读{d}页。第{n}天{zh}读了多少页？",
            f"{en} reads {a} pages on the first day and {d} more pages each day than the day before. "
            f"How many pages does {en} read on day {n}?", a + (n - 1) * d)


GENERATORS: dict[str, Callable[[random.Random], tuple[str, str, int]]] = {
    "arithmetic": _arithmetic,
    "combinations": _combinations,
    "remainders": _remainders,
    "rectangle_area": _rectangle_area,
    "arithmetic_series": _arithmetic_series,
}
CATEGORIES = tuple(GENERATORS)
_REDRAWS = 20


def generate_pairs(n: int = 200, seed: int = 0, *, categories: tuple[str, ...] = CATEGORIES) -> list[BilingualPair]:
    """``n`` Chinese/English problem pairs, categories interleaved, fully determined by ``seed``."""
    if int(n) != n or n < 1:
        raise InputError(f"--n must be a positive integer, got {n}")
    unknown = [c for c in categories if c not in GENERATORS]
    if unknown:
        raise InputError(f"unknown problem categories {unknown}; available: {', '.join(CATEGORIES)}")
    rng = random.Random(f"layerscope-zh-en-{seed}")
    out = []
    seen: set[str] = set()
    for i in range(int(n)):
        cat = categories[i % len(categories)]
        # Redraw a problem already made (small number ranges repeat); after a few tries keep the repeat,
        # so very large n still terminates.
        for _ in range(_REDRAWS):
            zh, en, answer = GENERATORS[cat](rng)
            if en not in seen:
                break
        seen.add(en)
        out.append(BilingualPair(id=f"zh-en-{seed}-{i}", source=zh, target=en, category=cat, answer=int(answer)))
    return out
