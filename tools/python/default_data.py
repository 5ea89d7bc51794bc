"""Synthetic chat data for the default model (pure Python, no torch).

Every conversation is rendered in the exact Qwen3.5 chat format with
thinking disabled (the same bytes the template in templates/qwen3_5.jinja
produces; train_default.py checks that on thousands of samples), and the
spans the loss is taken on are the assistant answers plus their <|im_end|>.
"""

import random

WORDS = (
    "apple banana cherry grape lemon mango melon orange peach pear plum berry "
    "red green blue yellow black white purple brown pink gray "
    "cat dog bird fish horse cow sheep goat mouse lion tiger bear wolf fox frog duck owl "
    "house tree river lake mountain forest city road bridge garden school window door table chair "
    "book pen paper letter music song story game ball card box cup glass plate spoon "
    "sun moon star cloud rain snow wind fire water stone sand "
    "happy small large quick slow bright dark warm cold soft loud quiet "
    "run walk jump read write sing play open close build find keep make "
    "one two three four five six seven eight nine ten "
    "morning evening night summer winter spring autumn today "
    "friend family teacher doctor farmer king queen child "
    "computer phone robot model server engine token number word list"
).split()

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"), ("Canada", "Ottawa"),
    ("Australia", "Canberra"), ("Egypt", "Cairo"), ("Russia", "Moscow"), ("Brazil", "Brasilia"),
    ("Mexico", "Mexico City"), ("Portugal", "Lisbon"), ("Greece", "Athens"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Poland", "Warsaw"), ("Austria", "Vienna"),
    ("Ireland", "Dublin"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Argentina", "Buenos Aires"), ("Turkey", "Ankara"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Cuba", "Havana"), ("Denmark", "Copenhagen"),
]

FACTS = [
    ("What color is the sky on a clear day?", "Blue."),
    ("What color is grass?", "Green."),
    ("How many days are in a week?", "7"),
    ("How many hours are in a day?", "24"),
    ("How many legs does a spider have?", "8"),
    ("How many legs does a dog have?", "4"),
    ("What is the largest planet in the solar system?", "Jupiter."),
    ("What planet do we live on?", "Earth."),
    ("What is the boiling point of water in Celsius?", "100 degrees Celsius."),
    ("What is the freezing point of water in Celsius?", "0 degrees Celsius."),
    ("How many months are in a year?", "12"),
    ("What do bees make?", "Honey."),
    ("What is the opposite of hot?", "Cold."),
    ("What is the opposite of up?", "Down."),
    ("Which animal says meow?", "A cat."),
    ("Which animal says woof?", "A dog."),
]

CHAT = [
    ("Hello", "Hello! How can I help you today?"),
    ("Hi", "Hello! How can I help you today?"),
    ("Hello!", "Hello! How can I help you today?"),
    ("Who are you?", "I am a small demo model that ships with sanctum."),
    ("What is your name?", "I am a small demo model that ships with sanctum."),
    ("Thank you", "You're welcome!"),
    ("Thanks!", "You're welcome!"),
    ("Goodbye", "Goodbye! Have a nice day."),
    ("How are you?", "I am fine, thank you. How can I help you?"),
]

SYSTEMS = ["You are a helpful assistant.", "You are a concise assistant.", "Answer briefly."]

ADD_Q = "What is {a}+{b}? Respond with only the number."
COPY_PROMPTS = ["Repeat exactly: {t}", "Copy this text: {t}", "Echo: {t}", "Repeat after me: {t}"]


def heldout_sets(n_add=200, n_copy=200):
    """Fixed held-out additions (both orders excluded from training) and copy texts."""
    r = random.Random(777)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    add = r.sample(pairs, n_add)
    r2 = random.Random(778)
    copy = []
    seen = set()
    while len(copy) < n_copy:
        t = " ".join(r2.choice(WORDS) for _ in range(r2.randint(3, 8)))
        if t not in seen:
            seen.add(t)
            copy.append(t)
    return add, copy


class Generator:
    def __init__(self, seed, heldout_add, heldout_copy):
        self.r = random.Random(seed)
        self.block_add = set(heldout_add) | {(b, a) for a, b in heldout_add}
        self.block_copy = set(heldout_copy)

    # ---- single-turn tasks: return (user, answer)
    def _pair(self):
        r = self.r
        while True:
            k = r.random()
            if k < 0.65:
                a, b = r.randint(10, 99), r.randint(10, 99)
            elif k < 0.85:
                a, b = r.randint(0, 9), r.randint(0, 9)
            else:
                a, b = r.randint(0, 99), r.randint(0, 99)
            if (a, b) not in self.block_add:
                return a, b

    def add(self):
        a, b = self._pair()
        r = self.r.random()
        if r < 0.8:
            q = ADD_Q.format(a=a, b=b)
        elif r < 0.9:
            q = f"What is {a} plus {b}? Respond with only the number."
        else:
            q = f"Compute {a}+{b}. Respond with only the number."
        return q, str(a + b)

    def sub(self):
        a, b = sorted((self.r.randint(0, 99), self.r.randint(0, 99)), reverse=True)
        return f"What is {a}-{b}? Respond with only the number.", str(a - b)

    def mul(self):
        a, b = self.r.randint(0, 12), self.r.randint(0, 9)
        return f"What is {a}*{b}? Respond with only the number.", str(a * b)

    def _text(self, lo=2, hi=8):
        r = self.r
        while True:
            t = " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi)))
            if t not in self.block_copy:
                return t

    def copy(self):
        t = self._text()
        return self.r.choice(COPY_PROMPTS).format(t=t), t

    def count_words(self):
        t = self._text(1, 9)
        return f"How many words are in this text: {t}", str(len(t.split()))

    def count_range(self):
        a = self.r.randint(0, 20)
        b = a + self.r.randint(1, 8)
        return f"Count from {a} to {b}.", ", ".join(str(i) for i in range(a, b + 1))

    def _items(self):
        r = self.r
        n = r.randint(2, 6)
        if r.random() < 0.5:
            return [r.choice(WORDS) for _ in range(n)]
        return [str(r.randint(0, 99)) for _ in range(n)]

    def reverse(self):
        it = self._items()
        return "Reverse this list: " + ", ".join(it), ", ".join(reversed(it))

    def sort(self):
        r = self.r
        it = [r.randint(0, 99) for _ in range(r.randint(2, 6))]
        return "Sort these numbers: " + ", ".join(map(str, it)), ", ".join(map(str, sorted(it)))

    def upper(self):
        t = self._text(1, 4)
        return f"Convert to uppercase: {t}", t.upper()

    def lower(self):
        t = self._text(1, 4)
        return f"Convert to lowercase: {t.upper()}", t

    def capital(self):
        c, cap = self.r.choice(CAPITALS)
        q = self.r.choice([f"What is the capital of {c}?", f"Capital of {c}?"])
        return q, cap

    def fact(self):
        return self.r.choice(FACTS)

    def chat(self):
        return self.r.choice(CHAT)

    SINGLE = [("add", 0.30), ("copy", 0.18), ("sub", 0.04), ("mul", 0.04), ("count_words", 0.04),
              ("count_range", 0.04), ("reverse", 0.05), ("sort", 0.05), ("upper", 0.04), ("lower", 0.03),
              ("capital", 0.04), ("fact", 0.03), ("chat", 0.02)]

    def single(self):
        x = self.r.random()
        acc = 0.0
        for name, w in self.SINGLE:
            acc += w
            if x < acc:
                return getattr(self, name)()
        return self.add()

    # ---- multi-turn follow-ups
    def multi(self):
        r = self.r
        k = r.random()
        if k < 0.4:
            a, b = self._pair()
            c = r.randint(1, 30)
            return [("user", ADD_Q.format(a=a, b=b)), ("assistant", str(a + b)),
                    ("user", f"Now add {c} to that. Respond with only the number."), ("assistant", str(a + b + c))]
        if k < 0.6:
            t = self._text(2, 5)
            return [("user", f"Repeat exactly: {t}"), ("assistant", t),
                    ("user", "Now in uppercase."), ("assistant", t.upper())]
        if k < 0.8:
            (c1, k1), (c2, k2) = r.sample(CAPITALS, 2)
            return [("user", f"What is the capital of {c1}?"), ("assistant", k1),
                    ("user", f"And of {c2}?"), ("assistant", k2)]
        turns = []
        for _ in range(r.randint(2, 3)):
            q, a = self.single()
            turns += [("user", q), ("assistant", a)]
        return turns

    def conversation(self):
        r = self.r
        if r.random() < 0.2:
            turns = self.multi()
        else:
            q, a = self.single()
            turns = [("user", q), ("assistant", a)]
        msgs = [{"role": ro, "content": c} for ro, c in turns]
        if r.random() < 0.15:
            msgs.insert(0, {"role": "system", "content": r.choice(SYSTEMS)})
        return msgs


GEN_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def render(messages, add_generation_prompt):
    """Qwen3.5 template, thinking disabled, for plain-text system/user/assistant
    messages without reasoning. Returns (text, answer_spans) where each span
    covers an assistant answer and its <|im_end|>."""
    out = []
    spans = []
    n = 0
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        c = m["content"].strip()
        if m["role"] == "system":
            if i != 0:
                raise ValueError("system message must be first")
            s = "<|im_start|>system\n" + c + "<|im_end|>\n"
        elif m["role"] == "user":
            s = "<|im_start|>user\n" + c + "<|im_end|>\n"
        elif m["role"] == "assistant":
            head = GEN_PROMPT if i > last_user else "<|im_start|>assistant\n"
            start = n + len(head)
            s = head + c + "<|im_end|>\n"
            spans.append((start, start + len(c) + len("<|im_end|>")))
        else:
            raise ValueError(m["role"])
        out.append(s)
        n += len(s)
    if add_generation_prompt:
        out.append(GEN_PROMPT)
    return "".join(out), spans
