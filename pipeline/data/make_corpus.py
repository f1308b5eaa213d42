"""Regenerate `corpus.txt`: deterministic English-like paragraphs from templates and word lists written here.

The corpus is license-clean by construction (no third-party text). Paragraphs are separated by one blank line.
Run: `python pipeline/data/make_corpus.py` (writes corpus.txt next to this file; output is byte-identical each run).
"""

from __future__ import annotations

import random
from pathlib import Path

SEED = 20260101
TARGET_BYTES = 240_000

ANIMALS = {
    "cat": ("house", "fish", "soft", "purrs"), "dog": ("yard", "meat", "loyal", "barks"),
    "horse": ("stable", "hay", "strong", "neighs"), "cow": ("field", "grass", "calm", "moos"),
    "owl": ("forest", "mice", "wise", "hoots"), "duck": ("pond", "bread", "noisy", "quacks"),
    "bee": ("hive", "nectar", "busy", "buzzes"), "fox": ("woods", "berries", "clever", "yips"),
    "frog": ("marsh", "flies", "green", "croaks"), "sheep": ("meadow", "clover", "gentle", "bleats"),
    "lion": ("savanna", "zebras", "proud", "roars"), "rabbit": ("burrow", "carrots", "quick", "thumps"),
}
COLORS = {"sky": "blue", "grass": "green", "snow": "white", "coal": "black", "sun": "yellow",
          "blood": "red", "orange": "orange", "night": "dark", "cloud": "grey", "lemon": "yellow"}
NAMES = ["Anna", "Ben", "Clara", "David", "Ella", "Frank", "Grace", "Henry", "Iris", "Jack", "Lena", "Max",
         "Nora", "Oscar", "Paula", "Sam", "Tina", "Victor"]
PLACES = ["market", "library", "park", "bakery", "station", "river", "school", "garden", "harbor", "museum"]
ITEMS = {"market": "apples", "library": "a book", "park": "a kite", "bakery": "bread", "station": "a ticket",
         "river": "a boat", "school": "a pencil", "garden": "flowers", "harbor": "fresh fish", "museum": "a map"}
FEELINGS = ["happy", "tired", "curious", "calm", "excited", "proud", "hungry", "sleepy"]
WEATHER = ["sunny", "rainy", "cloudy", "windy", "foggy", "snowy", "stormy", "clear"]
CITIES = ["Northport", "Greenfield", "Stonebridge", "Riverton", "Lakeside", "Hillcrest", "Oakdale", "Westmoor"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
           "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"]
DISHES = {"soup": ["carrots", "onions", "water", "salt"], "salad": ["lettuce", "tomatoes", "oil", "lemon"],
          "pancakes": ["flour", "milk", "eggs", "sugar"], "bread": ["flour", "water", "yeast", "salt"],
          "tea": ["water", "leaves", "honey", "milk"], "rice": ["rice", "water", "butter", "salt"]}
VERBS = ["walked", "ran", "drove", "cycled", "sailed", "hurried", "wandered"]
TOOLS = {"hammer": "nails", "brush": "paint", "needle": "thread", "spoon": "soup", "key": "the door",
         "pen": "letters", "saw": "wood", "shovel": "soil"}


def _animal(r: random.Random) -> str:
    a = r.choice(list(ANIMALS))
    home, food, trait, sound = ANIMALS[a]
    s = [f"The {a} lives in the {home}.", f"It eats {food}.", f"The {a} is {trait} and it {sound}."]
    if r.random() < 0.5:
        s.append(f"Every morning the {a} leaves the {home} to look for {food}.")
    if r.random() < 0.5:
        s.append(f"When the {a} is happy, it {sound} loudly.")
    return " ".join(s)


def _story(r: random.Random) -> str:
    n, m = r.sample(NAMES, 2)
    p = r.choice(PLACES)
    day = r.choice(DAYS)
    f = r.choice(FEELINGS)
    s = [f"On {day}, {n} {r.choice(VERBS)} to the {p} to get {ITEMS[p]}.",
         f"At the {p}, {n} met {m}.", f'"Hello, {m}," said {n}. "How are you today?"',
         f'"I am {f}," said {m}. "I came to the {p} to get {ITEMS[p]} too."']
    if r.random() < 0.6:
        q = r.choice([x for x in PLACES if x != p])
        s.append(f"After that, they went to the {q} together and got {ITEMS[q]}.")
    s.append(f"In the evening, {n} went home and felt {r.choice(FEELINGS)}.")
    return " ".join(s)


def _qa(r: random.Random) -> str:
    out = []
    for _ in range(r.randint(2, 4)):
        kind = r.randrange(5)
        if kind == 0:
            thing = r.choice(list(COLORS))
            out.append(f"Question: What color is the {thing}? Answer: The {thing} is {COLORS[thing]}.")
        elif kind == 1:
            a, b = r.randint(0, 10), r.randint(0, 10)
            out.append(f"Question: What is {NUMBERS[a]} plus {NUMBERS[b]}? Answer: {NUMBERS[a]} plus "
                       f"{NUMBERS[b]} is {NUMBERS[a + b]}.")
        elif kind == 2:
            i = r.randrange(7)
            out.append(f"Question: What day comes after {DAYS[i]}? Answer: After {DAYS[i]} comes "
                       f"{DAYS[(i + 1) % 7]}.")
        elif kind == 3:
            animal = r.choice(list(ANIMALS))
            out.append(f"Question: Where does the {animal} live? Answer: The {animal} lives in the "
                       f"{ANIMALS[animal][0]}.")
        else:
            t = r.choice(list(TOOLS))
            out.append(f"Question: What do you use a {t} for? Answer: You use a {t} for {TOOLS[t]}.")
    return " ".join(out)


def _sequence(r: random.Random) -> str:
    kind = r.randrange(3)
    if kind == 0:
        a = r.randint(0, 8)
        b = r.randint(a + 5, 20)
        return "Let us count: " + ", ".join(NUMBERS[a:b + 1]) + "."
    if kind == 1:
        i = r.randrange(7)
        return "The days of the week are " + ", ".join(DAYS[i:] + DAYS[:i]) + "."
    i = r.randrange(12)
    return "The months of the year are " + ", ".join(MONTHS[i:] + MONTHS[:i]) + "."


def _recipe(r: random.Random) -> str:
    d = r.choice(list(DISHES))
    ing = DISHES[d]
    return (f"To make {d}, you need {ing[0]}, {ing[1]}, {ing[2]} and {ing[3]}. First, put the {ing[0]} in a bowl. "
            f"Then add the {ing[1]} and the {ing[2]}. Finally, add a little {ing[3]}. "
            f"The {d} is ready in {NUMBERS[r.randint(5, 20)]} minutes.")


def _weather(r: random.Random) -> str:
    c = r.choice(CITIES)
    w1, w2 = r.choice(WEATHER), r.choice(WEATHER)
    mo = r.choice(MONTHS)
    t = r.randint(2, 20)
    return (f"Weather report for {c} in {mo}. Today it is {w1} with a temperature of {NUMBERS[t]} degrees. "
            f"Tomorrow it will be {w2}. People in {c} should {'take an umbrella' if w2 in ('rainy', 'stormy') else 'enjoy the day'}.")


def _chat(r: random.Random) -> str:
    a = r.choice(list(ANIMALS))
    thing = r.choice(list(COLORS))
    return (f"User: Tell me about the {a}. Assistant: The {a} lives in the {ANIMALS[a][0]} and eats "
            f"{ANIMALS[a][1]}. User: What color is the {thing}? Assistant: The {thing} is {COLORS[thing]}.")


GENERATORS = [_animal, _story, _qa, _sequence, _recipe, _weather, _chat]


def make_corpus(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    """Return the corpus text (deterministic for a given seed and size)."""
    r = random.Random(seed)
    paras: list[str] = []
    size = 0
    while size < target_bytes:
        p = r.choice(GENERATORS)(r)
        paras.append(p)
        size += len(p) + 2
    return "\n\n".join(paras) + "\n"


if __name__ == "__main__":
    out = Path(__file__).with_name("corpus.txt")
    out.write_text(make_corpus())
    print(f"wrote {out} ({out.stat().st_size} bytes)")
