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
# paragraphs no head trained on, for `bench heads`' summaries
HELD_OUT_PARAGRAPHS = [
    "Lighthouses were built to warn ships of dangerous coasts and to guide them into harbours at night. Early "
    "lighthouses burned wood or coal in open fires, later ones used oil lamps with mirrors, and in the nineteenth "
    "century the Fresnel lens made their beams visible more than twenty miles out to sea. Today most lighthouses "
    "are automated, and satellite navigation has made many of them less important, but they remain landmarks.",
    "Bird migration is the regular seasonal movement of birds between breeding and wintering grounds. Many species "
    "fly thousands of kilometres each year, guided by the sun, the stars, the Earth's magnetic field and familiar "
    "landmarks. Migration lets birds use food that is plentiful in one place for only part of the year, but the "
    "journey is dangerous, and storms, hunting and the loss of stopover habitats kill many birds on the way.",
    "Tea was first drunk in China thousands of years ago, at first as a medicine and later as an everyday "
    "drink. Traders carried it along the Silk Road, and in the seventeenth century Dutch and English ships brought "
    "it to Europe, where it became so popular that Britain began growing it in India. Today tea is the most widely "
    "drunk beverage in the world after water, and green, black and oolong teas all come from the same plant.",
    "Honeybees live in colonies of tens of thousands of workers, a few hundred drones and a single queen. The "
    "workers collect nectar and pollen, build the wax comb, and tell each other where to find flowers with a "
    "waggle dance. Besides honey, bees pollinate many of the crops people eat, so the recent decline of bee "
    "colonies, caused by pesticides, parasites and disease, worries farmers and scientists alike.",
]

# More training prompts (a larger self-distillation set): subjects, templates and code tasks used for
# training only; the held-out prompts above stay as they were.
MORE_SUBJECTS = [
    "the stomach", "the lungs", "the skeleton", "muscles", "blood", "the liver", "the kidneys", "the skin",
    "the eye", "the ear", "taste", "smell", "memory", "dreams", "emotions", "habits", "stress", "motivation",
    "happiness", "creativity", "critical thinking", "problem solving", "decision making", "leadership",
    "negotiation", "customer service", "marketing", "advertising", "branding", "small businesses", "startups",
    "entrepreneurship", "taxes", "insurance", "mortgages", "credit cards", "saving money", "retirement planning",
    "cryptocurrency", "banks", "trade", "globalisation", "unemployment", "the economy", "poverty", "charity",
    "volunteering", "human rights", "elections", "the constitution", "the United Nations", "laws", "courts",
    "journalism", "social media", "smartphones", "video games", "virtual reality", "artificial intelligence",
    "robots", "self-driving cars", "drones", "satellites", "rockets", "space exploration", "Mars", "Jupiter",
    "comets", "the Big Bang", "galaxies", "light", "sound", "heat", "energy", "friction", "atoms", "molecules",
    "chemical reactions", "acids and bases", "the periodic table", "water", "oxygen", "carbon", "metals",
    "plastics", "glass", "paper", "cotton", "wool", "steel", "concrete", "wood", "clay", "salt", "sugar",
    "rice", "wheat", "potatoes", "tomatoes", "apples", "bananas", "oranges", "honey", "cheese", "milk", "eggs",
    "pizza", "pasta", "soup", "spices", "vegetarian cooking", "fermentation", "food safety", "vitamins",
    "protein", "fibre", "hydration", "running", "swimming", "yoga", "cycling", "hiking", "football", "basketball",
    "tennis", "baseball", "cricket", "golf", "skiing", "the marathon", "team sports", "board games", "puzzles",
    "card games", "magic tricks", "theatre", "film", "animation", "comics", "novels", "poetry", "fairy tales",
    "mythology", "history books", "biographies", "science fiction", "jazz", "classical music", "rock music",
    "the piano", "the drums", "singing", "dancing", "sculpture", "architecture", "interior design", "fashion",
    "knitting", "woodworking", "pottery", "calligraphy", "origami", "cats", "dogs", "horses", "elephants",
    "whales", "dolphins", "sharks", "penguins", "lions", "tigers", "wolves", "bears", "frogs", "snakes",
    "butterflies", "ants", "spiders", "coral reefs", "mushrooms", "trees", "flowers", "grass", "seeds", "soil",
    "weather", "clouds", "rain", "snow", "wind", "lightning", "tornadoes", "floods", "droughts", "air pollution",
    "plastic pollution", "endangered species", "national parks", "zoos", "farming", "fishing", "irrigation",
    "nuclear power", "hydroelectric power", "oil", "natural gas", "coal", "energy efficiency", "insulation",
    "public transport", "traffic", "roads", "ships", "cars", "motorcycles", "the wheel", "the steam engine",
    "the telephone", "radio", "television", "the light bulb", "the camera", "clocks", "calendars", "maps",
    "compasses", "writing", "the alphabet", "numbers", "zero", "fractions", "percentages", "algebra", "geometry",
    "probability", "statistics", "calculus", "prime numbers", "infinity", "logic", "philosophy", "ethics",
    "religion", "languages", "grammar", "punctuation", "spelling", "reading", "handwriting", "schools",
    "universities", "homework", "exams", "online learning", "teachers", "parenting", "childhood", "teenagers",
    "old age", "families", "weddings", "birthdays", "holidays", "travel", "tourism", "hotels", "camping",
    "packing for a trip", "airports", "passports", "different cultures", "cooking at home", "cleaning a house",
    "moving house", "renting an apartment", "neighbours", "pets", "houseplants", "gardening tools", "a first job",
    "remote work", "meetings", "presentations", "email", "note taking", "productivity", "procrastination",
    "goal setting", "journaling", "mindfulness", "gratitude", "patience", "courage", "empathy", "forgiveness",
    "respect", "trust", "conflict resolution", "listening", "asking questions", "giving feedback", "mentoring",
    "Python", "JavaScript", "HTML", "CSS", "SQL", "the command line", "Linux", "APIs", "JSON", "regular expressions",
    "debugging", "code reviews", "open source software", "software design", "object-oriented programming",
    "functional programming", "variables", "loops", "functions", "classes", "lists and arrays", "dictionaries",
    "linked lists", "trees in computer science", "graphs in computer science", "binary search", "big O notation",
    "caching", "concurrency", "computer networks", "Wi-Fi", "Bluetooth", "GPS", "cybersecurity", "phishing",
    "viruses", "bacteria", "antibiotics", "the common cold", "fever", "allergies", "first aid", "hospitals",
    "doctors", "nurses", "dentists", "medicine", "surgery", "mental health", "loneliness", "the Middle Ages",
    "the Industrial Revolution", "the Vikings", "ancient Rome", "ancient Egypt", "the Silk Road", "castles",
    "knights", "explorers", "the moon landing", "the Cold War", "world history", "archaeology", "dinosaurs",
    "fossils", "the Ice Age", "continents", "islands", "lakes", "caves", "canyons", "the Amazon river",
    "the Sahara", "the Arctic", "Antarctica", "cities of the future", "skyscrapers", "tunnels", "dams",
]

WIDER_SUBJECTS = [          # places, people, animals, trades and everyday things: only the draft model's data has these
    "the Renaissance painters", "the Eiffel Tower", "the Statue of Liberty", "the Great Barrier Reef", "the Nile",
    "the Pacific Ocean", "the Atlantic Ocean", "the Mediterranean Sea", "the Dead Sea", "Iceland", "Japan", "Brazil",
    "India", "Canada", "Australia", "Kenya", "Norway", "Mexico", "Peru", "the Aztecs", "the Maya", "the Incas",
    "the Ottoman Empire", "the Mongol Empire", "the British Empire", "the American Revolution",
    "the Civil Rights Movement", "the Berlin Wall", "the Titanic", "the Wright brothers", "Marie Curie",
    "Isaac Newton", "Albert Einstein", "Charles Darwin", "Leonardo da Vinci", "Shakespeare", "Mozart", "Beethoven",
    "Galileo", "Ada Lovelace", "Alan Turing", "Nikola Tesla", "Florence Nightingale", "Cleopatra", "Napoleon",
    "Gandhi", "the alphabet's history", "hieroglyphs", "cave paintings", "Stonehenge", "the Colosseum",
    "Machu Picchu", "the Taj Mahal", "Venice", "Paris", "London", "New York", "Tokyo", "Rome", "cheetahs", "giraffes",
    "zebras", "gorillas", "chimpanzees", "pandas", "koalas", "kangaroos", "owls", "eagles", "parrots", "crows",
    "hummingbirds", "flamingos", "swans", "turtles", "crocodiles", "lizards", "jellyfish", "starfish", "crabs",
    "lobsters", "salmon", "goldfish", "bats", "hedgehogs", "foxes", "rabbits", "squirrels", "mice", "deer", "camels",
    "cows", "sheep", "goats", "chickens", "pigs", "ducks", "earthworms", "mosquitoes", "ladybirds", "dragonflies",
    "snails", "moss", "ferns", "cacti", "bamboo", "sunflowers", "roses", "tulips", "orchids", "algae", "plankton",
    "wetlands", "grasslands", "tundra", "savannas", "mangroves", "estuaries", "waterfalls", "geysers", "hot springs",
    "sand dunes", "beaches", "cliffs", "valleys", "tectonic plates", "minerals", "crystals", "diamonds", "gold",
    "silver", "copper", "iron", "aluminium", "granite", "marble", "limestone", "sandstone", "the Earth's core",
    "the atmosphere", "the ozone layer", "auroras", "eclipses", "meteor showers", "asteroids", "the Sun", "Venus",
    "Saturn", "Neptune", "Pluto", "the Milky Way", "nebulae", "supernovas", "exoplanets", "the speed of light",
    "time zones", "leap years", "the equator", "latitude and longitude", "magnetism in nature", "static electricity",
    "circuits", "transistors", "microchips", "semiconductors", "lasers", "microscopes", "X-rays", "MRI scans",
    "ultrasound", "thermometers", "barometers", "refrigerators", "washing machines", "microwaves", "ovens",
    "vacuum cleaners", "air conditioning", "central heating", "elevators", "escalators", "locks and keys", "zippers",
    "buttons", "glue", "paint", "ink", "pencils", "pens", "printers", "scanners", "keyboards", "computer mice",
    "touchscreens", "headphones", "speakers", "microphones", "podcasts", "streaming services", "online shopping",
    "search engines", "email spam", "cookies on websites", "web design", "mobile apps", "app stores", "video calls",
    "digital photos", "file formats", "data compression", "backups", "cloud storage", "database indexes",
    "machine translation", "speech recognition", "chatbots", "recommendation systems", "computer vision",
    "data science", "big data", "the Turing test", "quantum computers", "blockchains", "smart homes",
    "wearable technology", "smartwatches", "fitness trackers", "e-books", "audiobooks", "newspapers", "magazines",
    "radio shows", "documentaries", "cartoons", "superheroes", "detective stories", "adventure stories",
    "fantasy novels", "dragons in myths", "folk songs", "opera", "ballet", "hip hop", "the blues", "country music",
    "orchestras", "choirs", "the flute", "the trumpet", "the saxophone", "the harp", "the ukulele", "film music",
    "sound effects", "stand-up comedy", "circuses", "puppets", "festivals", "carnivals", "fireworks", "parades",
    "art museums", "street art", "graffiti", "mosaics", "stained glass", "tapestries", "embroidery", "sewing",
    "quilting", "baking cakes", "cookies", "pancakes", "sandwiches", "salads", "curry", "sushi", "tacos", "noodles",
    "dumplings", "barbecue", "breakfast", "lunch", "dinner parties", "table manners", "restaurants", "cafes",
    "markets", "supermarkets", "food waste", "organic food", "vegan diets", "fasting", "nutrition labels", "calories",
    "cholesterol", "blood pressure", "diabetes", "asthma", "headaches", "back pain", "posture", "eyesight", "glasses",
    "hearing aids", "teeth", "brushing teeth", "sunscreen", "sunburn", "hand washing", "sleep hygiene", "naps",
    "morning routines", "evening routines", "weekends", "hobbies", "collecting stamps", "bird watching",
    "fishing as a hobby", "rock climbing", "sailing", "surfing", "kayaking", "skateboarding", "martial arts",
    "boxing", "gymnastics", "figure skating", "ice hockey", "rugby", "volleyball", "table tennis", "badminton",
    "archery", "horse riding", "chess openings", "sudoku", "crossword puzzles", "jigsaw puzzles", "video game design",
    "toys", "playgrounds", "summer camps", "scouting", "birthday parties", "gift giving", "letters", "postcards",
    "diaries", "family trees", "grandparents", "siblings", "twins", "babies", "toddlers", "adolescence", "adulthood",
    "careers", "salaries", "promotions", "resumes", "internships", "apprenticeships", "trades", "plumbers",
    "electricians", "carpenters", "farmers", "firefighters", "police officers", "pilots", "astronauts", "scientists",
    "engineers", "architects", "lawyers", "judges", "librarians", "chefs", "artists", "musicians", "writers",
    "journalism as a career", "photographers", "designers", "programmers", "accountants", "economists",
    "psychologists", "social workers", "veterinarians", "pharmacists", "paramedics", "the scientific method",
    "experiments", "hypotheses", "peer review", "measurement", "units of length", "weights and scales",
    "temperature scales", "density", "pressure", "buoyancy", "levers", "pulleys", "gears", "springs", "pendulums",
    "waves", "echoes", "colours", "mirrors", "lenses", "shadows", "reflections", "rainwater harvesting", "wells",
    "water treatment", "sewage systems", "garbage collection", "landfills", "incineration", "upcycling",
    "second-hand shopping", "minimalism", "decluttering", "budget travel", "road trips", "train journeys", "cruises",
    "backpacking", "hostels", "souvenirs", "jet lag", "learning to drive", "traffic lights", "roundabouts", "parking",
    "car maintenance", "tyres", "petrol stations", "electric scooters", "walking", "city parks", "community gardens",
    "urban planning", "villages", "suburbs", "farms", "barns", "windmills",
]

MORE_TEMPLATES = [
    "Tell me about {s}.",
    "How does {s} work?",
    "What should everyone know about {s}?",
    "Write a short story that involves {s}.",
    "Give step-by-step advice for someone interested in {s}.",
    "What are some common misconceptions about {s}?",
    "Summarise the history of {s} in a few sentences.",
    "Write a short email to a friend about {s}.",
    "Explain {s} using an analogy.",
    "What are the key ideas behind {s}?",
    "Write a haiku about {s}.",
    "Give me a simple definition of {s} and an example.",
]

MORE_CODE_TASKS = [
    "returns the second largest number in a list", "checks whether a list is sorted", "counts the lines in a text file",
    "reads a CSV file and returns its rows", "converts a string to title case", "returns the longest word in a sentence",
    "computes the area of a circle", "checks whether a string contains only digits", "reverses the words in a sentence",
    "returns the sum of the even numbers in a list", "finds the index of an item in a list", "transposes a matrix",
    "multiplies two matrices", "computes the mean and standard deviation of a list", "generates a random password",
    "validates an email address", "counts the characters in a string", "removes whitespace from a string",
    "splits a list into chunks of size n", "finds the common elements of two lists", "implements binary search",
    "implements bubble sort", "implements a stack class", "implements a queue class", "computes compound interest",
    "converts a decimal number to binary", "checks whether a number is a perfect square", "returns all primes below n",
    "finds the minimum and maximum of a list", "counts the words in a sentence",
]
MORE_CODE_TEMPLATES = ["Write a Python function that {t}, and explain how it works.", "How do I write a function that {t} in Python?"]

DERIVED_TEMPLATES = [          # prompts over the model's own earlier answers (summaries, rewrites)
    SUMMARY_TEMPLATE,
    "Summarise the following text in one sentence.\n\n{text}",
    "Summarise the following text in two sentences.\n\n{text}",
    "List the key points of the following text.\n\n{text}",
    "Rewrite the following text in simpler words.\n\n{text}",
]



def open_prompts(subjects, code_tasks) -> list[str]:
    return ([t.format(s=s) for s in subjects for t in TEMPLATES]
            + [t.format(t=task) for task in code_tasks for t in CODE_TEMPLATES])


def train_prompts() -> list[str]:
    return open_prompts(TRAIN_SUBJECTS, CODE_TASKS)


def more_train_prompts() -> list[str]:
    """The larger training set: every subject with every template, every code task with every code template."""
    subjects, templates = TRAIN_SUBJECTS + MORE_SUBJECTS, TEMPLATES + MORE_TEMPLATES
    tasks, code_templates = CODE_TASKS + MORE_CODE_TASKS, CODE_TEMPLATES + MORE_CODE_TEMPLATES
    return ([t.format(s=s) for s in subjects for t in templates]
            + [t.format(t=task) for task in tasks for t in code_templates])


def draft_train_prompts() -> list[str]:
    """The draft model's training set: the larger set, and every template over more subjects. A draft is a whole
    language model, so it gains from the breadth of what it reads: a subject it has seen answered in other words
    is far easier to draft than an unseen one."""
    templates = TEMPLATES + MORE_TEMPLATES
    return more_train_prompts() + [t.format(s=s) for s in WIDER_SUBJECTS for t in templates]


def held_out_prompts() -> list[str]:
    return open_prompts(HELD_OUT_SUBJECTS, HELD_OUT_CODE_TASKS)


def summary_prompt(text: str) -> str:
    return SUMMARY_TEMPLATE.format(text=text.strip())


def derived_prompt(text: str, i: int) -> str:
    """The i-th answer's summary or rewrite (two in five the two-sentence summary `bench heads` asks for)."""
    return DERIVED_TEMPLATES[i % len(DERIVED_TEMPLATES)].format(text=text.strip())
