"""Prompt sets, disjoint: the held-out evaluation prompts (never trained or tuned on), the
templated training prompts used to distil the draft, and the policy prompts that the
draft-length policies are traced on (the draft has never seen them, so the acceptance
the policies learn is the acceptance they will meet on new prompts)."""

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


# Everyday situations and the writing tasks people ask an assistant about them (added after
# the first 816 prompts, so the stored shards of earlier collections keep their prompts).
SITUATIONS = [
    "a job interview", "a birthday party", "moving to a new city", "learning a new language", "saving money",
    "the first day at a new school", "a lost dog", "a road trip", "cooking dinner for friends", "a noisy neighbour",
    "starting a small business", "a power outage", "a science fair", "training for a marathon", "visiting grandparents",
    "a museum visit", "adopting a cat", "writing a resume", "a team meeting", "a wedding speech",
    "a flat tyre", "a school reunion", "volunteering at an animal shelter", "a missed flight", "painting a room",
    "a chess tournament", "a surprise party", "buying a used car", "a family picnic", "a delayed train",
    "organizing a closet", "a book club", "a thunderstorm at night", "a new puppy", "a cooking competition",
    "a broken phone screen", "learning to swim", "a farewell party for a colleague", "a group project",
    "a visit to the dentist", "a garage sale", "a long winter", "a football match", "a charity run",
]

SITUATION_TEMPLATES = [
    "Write a short email to a friend about {}.",
    "Give me five tips for {}.",
    "Write a diary entry about {}.",
    "Write a short dialogue between two people about {}.",
    "Write a short story about {}.",
    "Make a checklist for {}.",
    "What are common mistakes people make with {}?",
    "Write a formal letter about {}.",
    "Describe {} in vivid detail.",
    "Explain step by step how to prepare for {}.",
    "Write a funny short story about {}.",
    "Write a short news report about {}.",
    "Summarize the most important advice about {} in a short paragraph.",
    "Write a text message inviting someone to {}.",
]

MORE_CODE_TASKS = [
    "parses a date string", "computes the n-th triangular number", "checks whether a year is a leap year",
    "returns the unique elements of a list", "counts the lines of a file", "computes the dot product of two vectors",
    "transposes a matrix", "converts a string to title case", "finds the mode of a list", "rotates a list by k positions",
    "checks whether parentheses in a string are balanced", "computes compound interest",
    "splits a list into chunks of size n", "finds all divisors of a number", "removes the vowels from a string",
    "returns the intersection of two lists",
]

MORE_CODE_TEMPLATES = [
    "Write a Python function that {} and show an example call.",
    "Write a Go function that {}.",
    "Write a Rust function that {}.",
]


# Written for tracing the policies: no prompt is a training or held-out one, and most topics are new
# (the draft never saw the target answer any of them).
POLICY_PROMPTS = [
    "Give me four tips for keeping houseplants alive in winter.",
    "Write a short thank-you note to a neighbour who watered my plants.",
    "List the steps to change a bicycle inner tube.",
    "Suggest a weekly meal plan for a student on a tight budget.",
    "Explain how to set up a simple monthly budget spreadsheet.",
    "Draft a short announcement that the office kitchen will be closed on Monday.",
    "Give advice to someone who is nervous about public speaking.",
    "Outline a one-hour lesson plan about fractions for a primary school class.",
    "Write a short story about a clockmaker who builds a clock that runs backwards.",
    "Describe a quiet village square during a summer evening festival.",
    "Write a poem about a fox crossing a frozen river.",
    "Tell a fairy tale about a cloud that wanted to become a river.",
    "Write the first paragraph of a science fiction story set on a generation ship.",
    "Describe the smell and sounds of a bakery early in the morning.",
    "Write a short conversation between a lighthouse and a passing ship.",
    "Write a letter from a knight to his younger sister about his first tournament.",
    "Write a Python function that counts how many times each character appears in a string.",
    "Write a Python function that checks whether a list is sorted.",
    "Explain what a dictionary is in Python, with a short example.",
    "Write a SQL query that lists the ten most expensive products in a table named products.",
    "Write a JavaScript function that capitalizes every word in a sentence.",
    "Write a Python class for a to-do list with add, remove and list methods.",
    "How do I write a JSON file in Python? Show a short example.",
    "Write a shell command that finds all files larger than 100 MB in the home folder.",
    "Why do leaves change colour in autumn?",
    "How do submarines dive and surface?",
    "What is the difference between weather and climate?",
    "How does a microwave oven heat food?",
    "What is the function of the kidneys?",
    "Who was Ada Lovelace and why is she remembered?",
    "Why do onions make people cry when they are cut?",
    "Why does metal feel colder than wood at the same temperature?",
    "What causes the northern lights?",
    "Why do we have leap years?",
    "What is inflation and how does it affect savings?",
    "How do noise-cancelling headphones work?",
    "Why is the sky dark at night if there are so many stars?",
    "What is the tallest mountain in Africa and how high is it?",
    "How does a refrigerator keep food cold?",
    "What does a compiler do?",
]


def policy_prompts() -> list[str]:
    """The prompts that ``specdec-fast train-policy`` traces (40), in neither the training nor the held-out set."""
    return list(POLICY_PROMPTS)


def heldout_prompts() -> list[dict]:
    """The held-out evaluation set: [{"kind": instruction|prose|code|qa, "prompt": str}], 34 prompts."""
    text = resources.files("specdec_fast.data").joinpath("heldout_prompts.json").read_text()
    return json.loads(text)


def training_prompts() -> list[str]:
    """Templated prompts for distillation (1,616), none of them in the held-out set."""
    prompts = [t.format(x) for t, x in itertools.product(TEMPLATES, TOPICS)]
    prompts += [t.format(x) for t, x in itertools.product(CODE_TEMPLATES, CODE_TASKS)]
    prompts += [t.format(x) for t, x in itertools.product(SITUATION_TEMPLATES, SITUATIONS)]
    prompts += [t.format(x) for t, x in itertools.product(CODE_TEMPLATES + MORE_CODE_TEMPLATES, MORE_CODE_TASKS)]
    prompts += [t.format(x) for t, x in itertools.product(MORE_CODE_TEMPLATES, CODE_TASKS)]
    held = {p["prompt"] for p in heldout_prompts()}
    return [p for p in prompts if p not in held]
