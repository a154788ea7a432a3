"""Text for tools/data/speech.py: what the voices read, and the evaluation texts they must never read.

Three sources, split into train and held-out with no sentence in both:
- Debian ``fortunes`` and the King James Bible, exactly as tools/data/corpus.py cleans, groups and
  splits them (whole fortune files and Bible books held out).
- Everyday sentences written for this project (below; MIT like the project): names, times, dates,
  prices, phone numbers, counts, addresses and questions, which the other two sources lack
  (make_corpus drops every sentence with a digit). Templates are split between train and held-out,
  so a held-out sentence is never a train sentence with other slots filled in.

The real recordings that the benchmark scores (data/real, made by python -m tools.data real) and
their texts must never enter training: ``Exclusion`` reads every transcript in data/real/*.csv
(JFK's inaugural line, the ALSA channel names, the Asterisk prompts, the LibriVox Sense and
Sensibility sentences, Shakespeare's Sonnet 1, praatio's and pocketsphinx's utterances, the CMU
ARCTIC prompts) and drops any utterance that equals, contains, or shares a run of
``EXCLUDE_NGRAM`` words with one of them (fortunes quote JFK and Shakespeare, for instance).
"""

from __future__ import annotations

import csv
import random
import re
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Set, Tuple

from tools.data import corpus
from tools.data.corpus import Utterance

# an utterance sharing this many consecutive words with an evaluation transcript is dropped
EXCLUDE_NGRAM = 5
# an evaluation transcript of at least this many words is dropped wherever it occurs inside an utterance
EXCLUDE_MIN_CONTAINED = 3


def words(text: str) -> List[str]:
    """Lower-case words with punctuation dropped: the form texts are compared in."""
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?", text.lower())


class Exclusion:
    """The evaluation transcripts, and the test of whether an utterance comes too close to one."""

    def __init__(self, sentences: Iterable[str]):
        self.sentences = [w for w in (words(s) for s in sentences) if w]
        self.whole = {" ".join(w) for w in self.sentences}
        self.contained = [" " + " ".join(w) + " " for w in self.sentences if len(w) >= EXCLUDE_MIN_CONTAINED]
        self.ngrams: Set[Tuple[str, ...]] = set()
        for w in self.sentences:
            self.ngrams.update(tuple(w[i:i + EXCLUDE_NGRAM]) for i in range(len(w) - EXCLUDE_NGRAM + 1))

    @classmethod
    def from_dir(cls, real_dir: Path) -> "Exclusion":
        """Every `sentence` of every CSV under real_dir; a ValueError when there is none to read, since
        an exclusion list that silently reads nothing would let the evaluation texts through."""
        sentences = []
        for path in sorted(Path(real_dir).glob("*.csv")):
            with path.open(newline="", encoding="utf-8") as f:
                sentences += [row["sentence"] for row in csv.DictReader(f) if row.get("sentence")]
        if not sentences:
            raise ValueError(f"{real_dir}: no transcripts of the evaluation recordings to exclude "
                             "(run python -m tools.data real first, or pass --real DIR)")
        return cls(sentences)

    def __len__(self) -> int:
        return len(self.sentences)

    def hits(self, text: str) -> bool:
        w = words(text)
        joined = " " + " ".join(w) + " "
        if joined.strip() in self.whole or any(s in joined for s in self.contained):
            return True
        return any(tuple(w[i:i + EXCLUDE_NGRAM]) in self.ngrams for i in range(len(w) - EXCLUDE_NGRAM + 1))


# -- everyday sentences -----------------------------------------------------------------------------

FIRST = ("James", "Mary", "Robert", "Patricia", "John", "Jennifer", "Michael", "Linda", "David", "Elizabeth",
         "William", "Barbara", "Richard", "Susan", "Joseph", "Jessica", "Thomas", "Sarah", "Charles", "Karen",
         "Daniel", "Nancy", "Matthew", "Lisa", "Anthony", "Betty", "Mark", "Sandra", "Paul", "Ashley", "Steven",
         "Emily", "Andrew", "Michelle", "Kevin", "Amanda", "Brian", "Melissa", "George", "Deborah", "Priya",
         "Wei", "Ahmed", "Fatima", "Carlos", "Sofia", "Olga", "Kenji", "Aisha", "Mateo", "Ingrid", "Tomasz",
         "Chiara", "Nikhil", "Siobhan", "Dmitri", "Grace", "Oliver", "Hannah", "Lucas")
LAST = ("Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Rodriguez", "Martinez",
        "Hernandez", "Lopez", "Wilson", "Anderson", "Taylor", "Moore", "Jackson", "Martin", "Lee", "Thompson",
        "White", "Harris", "Clark", "Lewis", "Walker", "Hall", "Young", "King", "Wright", "Nguyen", "Patel",
        "Kowalski", "O'Brien", "Schmidt", "Rossi", "Yamamoto", "Okafor", "Fischer", "Novak", "Campbell")
PLACES = ("Chicago", "Denver", "Boston", "Seattle", "Atlanta", "Houston", "Phoenix", "Portland", "Dallas", "Miami",
          "Toronto", "Dublin", "Manchester", "Glasgow", "Leeds", "Bristol", "Edinburgh", "Melbourne", "Auckland",
          "Vancouver", "Nashville", "Pittsburgh", "Sacramento", "Omaha", "Cardiff", "Brighton", "Ottawa", "Austin")
STREETS = ("Maple", "Oak", "Church", "Station", "Mill", "Park", "Victoria", "High", "Elm", "Bridge", "Cedar",
           "Lincoln", "Washington", "King", "Queen", "Market", "Spring", "Chestnut", "Union", "Harbour")
ITEMS = ("the blue folder", "a ladder", "two boxes of nails", "the spare key", "a bag of oranges",
         "the printer cartridge", "three folding chairs", "the laptop charger", "a loaf of bread", "the winter coats",
         "the red umbrella", "a dozen eggs", "the tax forms", "my reading glasses", "the car keys",
         "a bottle of olive oil", "the extension cord", "the birthday card", "a roll of tape", "the tent pegs")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
            "twelfth", "fifteenth", "twentieth", "twenty-first", "thirtieth")


def _slots(rng: random.Random) -> Dict[str, str]:
    """One random value for every slot a template may use; digits are kept as digits (the voices'
    text front ends read them, and Whisper writes numbers as digits)."""
    hour, minute = rng.randint(1, 12), rng.choice((0, 0, 5, 10, 15, 20, 30, 40, 45, 50))
    spoken_time = rng.choice((f"{hour}:{minute:02d}" if minute else f"{hour} o'clock",
                              f"{hour}:{minute:02d} {rng.choice(('a.m.', 'p.m.'))}" if minute
                              else f"{hour} {rng.choice(('a.m.', 'p.m.'))}",
                              f"half past {hour}", f"quarter to {hour}"))
    cents = rng.choice((0, 0, 50, 99, 25, 75, 10))
    price = rng.choice(("$", "$", "£", "€")) + (f"{rng.randint(1, 300)}.{cents:02d}" if cents else str(rng.randint(1, 2000)))
    return {
        "first": rng.choice(FIRST), "first2": rng.choice(FIRST), "last": rng.choice(LAST),
        "place": rng.choice(PLACES), "street": rng.choice(STREETS), "item": rng.choice(ITEMS),
        "weekday": rng.choice(WEEKDAYS), "month": rng.choice(MONTHS), "ordinal": rng.choice(ORDINALS),
        "time": spoken_time, "time2": f"{rng.randint(1, 12)}:{rng.choice((15, 30, 45))}",
        "price": price, "small": str(rng.randint(2, 19)), "small2": str(rng.randint(3, 14)),
        "big": f"{rng.randint(1, 99)},{rng.randint(0, 999):03d}", "number": str(rng.randint(1, 250)),
        "year": str(rng.randint(1948, 2024)), "day": str(rng.randint(1, 28)), "percent": str(rng.randint(3, 97)),
        "phone": f"{rng.randint(200, 989)} {rng.randint(0, 9999):04d}", "gate": f"{rng.choice('ABCD')}{rng.randint(1, 40)}",
        "temp": str(rng.randint(-15, 38)), "order": str(rng.randint(10000, 99999)), "room": str(rng.randint(101, 950)),
        "distance": rng.choice(("half a", "two", "three", "1.5", "10", "twenty")),
    }


TRAIN_TEMPLATES = (
    "Hi {first}, it's {first2}. Can you call me back before {time}?",
    "The meeting with {first} {last} has been moved to {weekday} at {time}.",
    "I paid {price} for {item}, which seems like a lot to me.",
    "Did you remember to bring {item}? We need it tonight.",
    "Our flight to {place} leaves at {time} from gate {gate}.",
    "{first} lives at {number} {street} Street, just past the school.",
    "How many people are coming on {weekday}? I counted {small} so far.",
    "The total comes to {price}. Will you pay by card or cash?",
    "Turn left after {distance} miles and you'll see the station on your right.",
    "Please send the report to {first} by the {ordinal} of {month}.",
    "My phone number is {phone}, and I'm usually home after {time}.",
    "Is it true that {first} ran {small} miles this morning?",
    "We sold {big} tickets last year and we hope to sell more this year.",
    "The temperature in {place} dropped to {temp} degrees overnight.",
    "Wait, did you say {time} or {time2}? I didn't quite catch it.",
    "Room {room} is on the {ordinal} floor, next to the lifts.",
    "{first}, could you pass me {item}, please?",
    "I think {first} moved to {place} in {year}, but I'm not sure.",
    "The train was {small} minutes late, so we missed the start of the film.",
    "Order number {order} was shipped on {weekday} and should arrive by {month} {day}.",
    "Why don't we meet at the cafe on {street} Street at {time}?",
    "About {percent} percent of the people we asked said yes.",
    "{first} {last} scored {small} points in the second half.",
    "Can I book a table for {small} at {time} on {weekday}?",
    "The library closes at {time} on weekdays and at noon on Saturdays.",
    "She was born on {month} {day}, {year}, in a small town near {place}.",
    "Honestly, I have no idea where {first} put {item}.",
    "Have you ever been to {place}? {first} says it's lovely in {month}.",
    "The electricity bill for {month} came to {price}, a little more than last time.",
    "Take {small} drops a day, with food, for {small2} days.",
    "What time does the pharmacy on {street} Street open on {weekday}?",
    "Sorry I'm late! The traffic on the way from {place} was terrible.",
    "If we leave at {time}, we should be in {place} before dark.",
    "{first} asked whether the {ordinal} chapter was finished yet.",
    "No, no, the party is on the {ordinal}, not the {day}th.",
)
HELDOUT_TEMPLATES = (
    "Good morning, this is {first} from the front desk. Your car is ready.",
    "The bus to {place} departs every {small} minutes until {time}.",
    "{first} still owes me {price}, but I'm not going to ask for it back.",
    "Could you spell your last name for me? Is it {last}?",
    "The parcel weighs {small} kilos and costs {price} to send.",
    "Which platform does the {time} train to {place} leave from?",
    "In {year}, the company had only {small} employees and one office.",
    "Let's say {time}, and if {first} is late we'll start without them.",
)


def template_utterances(split: str, count: int, rng: random.Random) -> List[Utterance]:
    """`count` everyday sentences from the split's own templates, one or two per utterance."""
    templates = TRAIN_TEMPLATES if split == "train" else HELDOUT_TEMPLATES
    out = []
    for _ in range(count):
        picked = rng.sample(range(len(templates)), rng.choice((1, 1, 1, 2)))
        text = " ".join(templates[i].format(**_slots(rng)) for i in picked)
        out.append(Utterance("everyday", f"template{picked[0]}", text))
    return out


# share of utterances that are everyday sentences; fortunes and the Bible are the rest
EVERYDAY_SHARE = 0.25


def speech_pool(split: str, docs: Dict, exclusion: Exclusion, rng: random.Random,
                banned: Sequence[str] = ()) -> Tuple[List[Utterance], int]:
    """The split's utterances in a seeded order, and how many were dropped for coming too close to
    an evaluation transcript (or, with `banned`, for repeating another split's text)."""
    pool = corpus.utterance_pool(docs, rng)
    pool += template_utterances(split, round(len(pool) * EVERYDAY_SHARE / (1 - EVERYDAY_SHARE)), rng)
    rng.shuffle(pool)
    banned_words = {" ".join(words(t)) for t in banned}
    kept, seen = [], set()
    for utt in pool:
        key = " ".join(words(utt.text))
        if key in seen:
            continue  # templates can repeat themselves
        seen.add(key)
        if key not in banned_words and not exclusion.hits(utt.text):
            kept.append(utt)
    return kept, len(pool) - len(kept)
