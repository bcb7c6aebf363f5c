"""Chat prompts for training draft heads on a chat model's own answers (self-distillation), and a held-out set.

Prompts are templates x subjects. The held-out subjects appear in no training prompt, so the held-out
acceptance figures measure questions the heads have not seen. Summaries ask the model to summarise
its own earlier answers (held-out summaries summarise held-out answers).
"""
from __future__ import annotations

TRAIN_SUBJECTS = [
    "photosynthesis", "the water cycle", "gravity", "black holes", "vaccines", "the immune system",
    "climate change", "volcanoes", "earthquakes", "the moon's phases", "electricity", "magnets",
    "the internet", "a computer's memory", "binary numbers", "encryption", "machine learning",
    "neural networks", "databases", "operating systems", "compilers", "recursion", "sorting algorithms",
    "hash tables", "the Roman Empire", "the French Revolution", "the printing press", "the Renaissance",
    "democracy", "inflation", "supply and demand", "interest rates", "stock markets", "budgeting",
    "healthy sleep", "regular exercise", "a balanced diet", "meditation", "learning a new language",
    "public speaking", "time management", "writing a cover letter", "job interviews", "teamwork",
    "gardening", "composting", "recycling", "solar power", "wind energy", "electric cars", "bicycles",
    "coffee", "bread baking", "chess", "music theory", "the guitar", "painting with watercolours",
    "photography", "the human heart", "the brain", "DNA", "evolution", "bees", "the ocean tides",
    "rainbows", "the seasons", "stars", "the solar system", "rivers", "deserts", "rainforests",
    "cities", "trains", "airplanes", "bridges", "the Great Wall of China", "the pyramids of Egypt",
    "friendship", "kindness", "honesty", "curiosity", "libraries", "museums", "email etiquette",
    "version control with git", "unit testing", "web browsers", "HTTP", "passwords", "cloud computing",
]

HELD_OUT_SUBJECTS = [
    "glaciers", "the printing of money", "tea", "octopuses", "the Olympic Games", "lighthouses",
    "spreadsheets", "batteries", "the violin", "mountains", "bird migration", "the metric system",
    "hurricanes", "ancient Greece", "3D printing", "chocolate", "telescopes", "forests", "the postal service",
    "renewable energy",
]

TEMPLATES = [
    "Explain {s} in simple terms.",
    "What is {s}? Give a short answer.",
    "Write a short paragraph about {s}.",
    "Give three interesting facts about {s}.",
    "Why is {s} important?",
    "Describe {s} to a ten-year-old.",
    "What are the main advantages and disadvantages of {s}?",
    "Write a short poem about {s}.",
    "List five questions a student might ask about {s}.",
    "How would you teach {s} to a beginner?",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "finds the largest element of a list",
    "removes duplicates from a list", "checks whether a word is a palindrome", "sums the digits of an integer",
    "converts Celsius to Fahrenheit", "merges two sorted lists", "computes the average of a list of numbers",
    "counts how often each word appears in a text", "flattens a nested list", "returns the greatest common divisor",
    "checks whether a year is a leap year", "capitalises every word in a sentence", "sorts a list of tuples by their second element",
]

HELD_OUT_CODE_TASKS = [
    "rotates a list by k positions", "checks whether two strings are anagrams", "returns the median of a list",
    "computes the power set of a small list", "converts a Roman numeral to an integer",
]

CODE_TEMPLATES = ["Write a Python function that {t}.", "Write a Python function that {t}, with a short docstring."]

SUMMARY_TEMPLATE = "Summarise the following text in two sentences.\n\n{text}"


def open_prompts(subjects, code_tasks) -> list[str]:
    return ([t.format(s=s) for s in subjects for t in TEMPLATES]
            + [t.format(t=task) for task in code_tasks for t in CODE_TEMPLATES])


def train_prompts() -> list[str]:
    return open_prompts(TRAIN_SUBJECTS, CODE_TASKS)


def held_out_prompts() -> list[str]:
    return open_prompts(HELD_OUT_SUBJECTS, HELD_OUT_CODE_TASKS)


def summary_prompt(text: str) -> str:
    return SUMMARY_TEMPLATE.format(text=text.strip())
