"""Prompt sets: the held-out evaluation prompts (never trained or tuned on) and the
templated training prompts used to distil the draft."""

from __future__ import annotations

import itertools
import json
from importlib import resources

TOPICS = [
    "volcanoes", "the water cycle", "honey bees", "black holes", "the Roman Empire", "electric cars",
    "the human heart", "chess", "coffee", "the internet", "recycling", "dinosaurs", "the moon landing",
    "earthquakes", "solar panels", "penguins", "the printing press", "vaccines", "friendship", "mountains",
    "machine learning", "the stock market", "jazz music", "the Great Wall of China", "sleep", "gravity",
    "bicycles", "rainforests", "the French Revolution", "octopuses", "magnets", "time zones",
    "the immune system", "origami", "a thunderstorm", "the Olympic Games", "bread making", "tides",
    "the periodic table", "wind turbines", "whales", "ancient Egypt", "democracy", "smartphones",
    "the solar system", "kindness", "hiking", "libraries", "cheese", "trains", "glaciers", "music theory",
    "elephants", "the brain", "cloud computing", "the Renaissance", "a city at dawn", "gardening",
    "the history of money", "owls",
]

TEMPLATES = [
    "Explain {} in simple terms.",
    "What is {}?",
    "Write a short paragraph about {}.",
    "Give three interesting facts about {}.",
    "Write a short poem about {}.",
    "Write a short story that involves {}.",
    "Describe {} to a ten-year-old.",
    "List the pros and cons of {}.",
    "How does {} work?",
    "Write a haiku about {}.",
    "Why is {} important?",
    "Write a short blog post about {}.",
]

CODE_TASKS = [
    "reverses a list", "computes the factorial of a number", "finds the maximum value in a list",
    "counts the vowels in a string", "sorts a list of numbers with bubble sort", "checks whether a number is prime",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "computes the average of a list",
    "removes whitespace from a string", "finds the greatest common divisor of two numbers", "flattens a nested list",
    "counts word frequencies in a text", "checks whether two strings are anagrams", "generates a random password",
    "computes the sum of the digits of a number", "converts a decimal number to binary",
    "finds the second largest number in a list", "capitalizes the first letter of each word",
    "validates an email address with a regular expression", "implements binary search",
    "returns the squares of the even numbers in a list", "reads a text file and prints its lines",
    "computes the length of the longest word in a sentence",
]

CODE_TEMPLATES = [
    "Write a Python function that {}.",
    "Write a JavaScript function that {}.",
    "Explain how to write a program that {}.",
    "Write a C function that {}.",
]


def heldout_prompts() -> list[dict]:
    """The held-out evaluation set: [{"kind": instruction|prose|code|qa, "prompt": str}], 34 prompts."""
    text = resources.files("specdec_fast.data").joinpath("heldout_prompts.json").read_text()
    return json.loads(text)


def training_prompts() -> list[str]:
    """Templated prompts for distillation (816), none of them in the held-out set."""
    prompts = [t.format(x) for t, x in itertools.product(TEMPLATES, TOPICS)]
    prompts += [t.format(x) for t, x in itertools.product(CODE_TEMPLATES, CODE_TASKS)]
    held = {p["prompt"] for p in heldout_prompts()}
    return [p for p in prompts if p not in held]


def chat_prompt_ids(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of ``prompt``, wrapped in the tokenizer's chat template when ``chat`` and it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False).input_ids
    return tokenizer(prompt).input_ids
