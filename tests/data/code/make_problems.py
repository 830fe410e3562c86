#!/usr/bin/env python3
"""Source of tests/data/code/problems.jsonl, the function-completion problems of
`zack eval --task code`. Every problem here was written for zack (see README.md);
run this script to regenerate the JSONL after an edit (--check compares instead).

A problem is a prompt (imports, signature and docstring, ending in a newline, so a
model continues it with the indented body), the entry point's name, Python asserts
that call the entry point directly, a reference body that passes them and a wrong
body (a plausible near miss: an edge case ignored, an off-by-one) that must fail
them. The bodies are indented as they follow the prompt."""
import doctest
import json
import os
import sys
import textwrap

P = []


def problem(tag, prompt, solution, wrong, tests):
    """prompt: source up to and including the docstring; solution/wrong: bodies (dedented,
    indented here by four spaces); tests: asserts at top level."""
    prompt = textwrap.dedent(prompt).lstrip("\n")
    if not prompt.endswith("\n"):
        prompt += "\n"
    entry = None
    for line in prompt.splitlines():
        if line.startswith("def "):
            entry = line[4:line.index("(")]
    assert entry, prompt

    def body(b):
        return textwrap.indent(textwrap.dedent(b).strip("\n"), "    ") + "\n"

    P.append({"id": "zack/%02d_%s" % (len(P) + 1, entry), "tag": tag, "prompt": prompt, "entry_point": entry,
              "canonical_solution": body(solution), "wrong_solution": body(wrong),
              "tests": textwrap.dedent(tests).strip("\n") + "\n"})


# ---- strings ----

problem("strings", '''
def count_vowels(text: str) -> int:
    """Return how many vowels (a, e, i, o, u, upper or lower case) the text contains.
    >>> count_vowels("Hello World")
    3
    """
''', '''
return sum(1 for c in text if c.lower() in "aeiou")
''', '''
return sum(1 for c in text if c in "aeiou")
''', '''
assert count_vowels("Hello World") == 3
assert count_vowels("") == 0
assert count_vowels("AEIOU aeiou") == 10
assert count_vowels("rhythm") == 0
assert count_vowels("Queue") == 4
''')

problem("strings", '''
def run_length_encode(text: str) -> str:
    """Encode each run of equal characters as the character followed by the run length.
    >>> run_length_encode("aaabcc")
    'a3b1c2'
    >>> run_length_encode("")
    ''
    """
''', '''
out = []
i = 0
while i < len(text):
    j = i
    while j < len(text) and text[j] == text[i]:
        j += 1
    out.append(text[i] + str(j - i))
    i = j
return "".join(out)
''', '''
out = []
for i in range(1, len(text)):
    if text[i] != text[i - 1]:
        out.append(text[i - 1])
return "".join(c + "1" for c in out)
''', '''
assert run_length_encode("aaabcc") == "a3b1c2"
assert run_length_encode("") == ""
assert run_length_encode("x") == "x1"
assert run_length_encode("zzzzzzzzzzzz") == "z12"
assert run_length_encode("abab") == "a1b1a1b1"
''')

problem("parsing", '''
def run_length_decode(code: str) -> str:
    """Decode a string of (character, count) pairs, where each count is a decimal
    number of one or more digits and the characters are letters.
    >>> run_length_decode("a3b1c2")
    'aaabcc'
    >>> run_length_decode("x12")
    'xxxxxxxxxxxx'
    """
''', '''
out = []
i = 0
while i < len(code):
    ch = code[i]
    j = i + 1
    while j < len(code) and code[j].isdigit():
        j += 1
    out.append(ch * int(code[i + 1:j]))
    i = j
return "".join(out)
''', '''
out = []
for i in range(0, len(code), 2):
    out.append(code[i] * int(code[i + 1]))
return "".join(out)
''', '''
assert run_length_decode("a3b1c2") == "aaabcc"
assert run_length_decode("x12") == "x" * 12
assert run_length_decode("") == ""
assert run_length_decode("a10b2") == "aaaaaaaaaabb"
assert run_length_decode("q1") == "q"
''')

problem("strings", '''
def is_balanced(text: str) -> bool:
    """Return True if the brackets (), [] and {} in the text are balanced and properly
    nested. Other characters are ignored.
    >>> is_balanced("f(a[1], {b: 2})")
    True
    >>> is_balanced("(]")
    False
    """
''', '''
pairs = {")": "(", "]": "[", "}": "{"}
stack = []
for c in text:
    if c in "([{":
        stack.append(c)
    elif c in pairs:
        if not stack or stack.pop() != pairs[c]:
            return False
return not stack
''', '''
return (text.count("(") == text.count(")") and text.count("[") == text.count("]")
        and text.count("{") == text.count("}"))
''', '''
assert is_balanced("f(a[1], {b: 2})") is True
assert is_balanced("(]") is False
assert is_balanced("") is True
assert is_balanced("([)]") is False
assert is_balanced("((") is False
assert is_balanced(")(") is False
assert is_balanced("{[()()]}") is True
''')

problem("strings", '''
def caesar_shift(text: str, k: int) -> str:
    """Shift every ASCII letter k places along the alphabet, wrapping around from z to a,
    and keep its case. k may be negative or larger than 26. Other characters are unchanged.
    >>> caesar_shift("Hello, World!", 3)
    'Khoor, Zruog!'
    """
''', '''
out = []
for c in text:
    if "a" <= c <= "z":
        out.append(chr((ord(c) - 97 + k) % 26 + 97))
    elif "A" <= c <= "Z":
        out.append(chr((ord(c) - 65 + k) % 26 + 65))
    else:
        out.append(c)
return "".join(out)
''', '''
out = []
for c in text:
    if "a" <= c <= "z":
        out.append(chr((ord(c) - 97 + k) % 26 + 97))
    else:
        out.append(c)
return "".join(out)
''', '''
assert caesar_shift("Hello, World!", 3) == "Khoor, Zruog!"
assert caesar_shift("xyz", 3) == "abc"
assert caesar_shift("abc", -1) == "zab"
assert caesar_shift("Zebra", 52) == "Zebra"
assert caesar_shift("Abc-9", 27) == "Bcd-9"
''')

problem("strings", '''
def snake_to_camel(name: str) -> str:
    """Convert a snake_case identifier to lowerCamelCase. Runs of underscores count as one
    separator, and leading or trailing underscores are dropped.
    >>> snake_to_camel("parse_http_reply")
    'parseHttpReply'
    """
''', '''
parts = [p for p in name.split("_") if p]
if not parts:
    return ""
return parts[0].lower() + "".join(p[0].upper() + p[1:].lower() for p in parts[1:])
''', '''
parts = name.split("_")
return parts[0] + "".join(p.capitalize() for p in parts[1:])
''', '''
assert snake_to_camel("parse_http_reply") == "parseHttpReply"
assert snake_to_camel("x") == "x"
assert snake_to_camel("__private_value") == "privateValue"
assert snake_to_camel("a__b") == "aB"
assert snake_to_camel("trailing_") == "trailing"
''')

problem("strings", '''
def camel_to_snake(name: str) -> str:
    """Convert a camelCase or PascalCase identifier to snake_case: an underscore goes before
    every upper-case letter except at the start, and everything becomes lower case.
    >>> camel_to_snake("fileSizeLimit")
    'file_size_limit'
    >>> camel_to_snake("Matrix")
    'matrix'
    """
''', '''
out = []
for i, c in enumerate(name):
    if c.isupper() and i > 0:
        out.append("_")
    out.append(c.lower())
return "".join(out)
''', '''
out = []
for c in name:
    if c.isupper():
        out.append("_")
    out.append(c.lower())
return "".join(out)
''', '''
assert camel_to_snake("fileSizeLimit") == "file_size_limit"
assert camel_to_snake("Matrix") == "matrix"
assert camel_to_snake("x") == "x"
assert camel_to_snake("PageUpKey") == "page_up_key"
assert camel_to_snake("aB") == "a_b"
''')

problem("strings", '''
def most_common_char(text: str) -> str:
    """Return the character that occurs most often in the text, spaces not counted.
    On a tie, return the one that appears first in the text. Return "" if there is none.
    >>> most_common_char("abracadabra")
    'a'
    >>> most_common_char("b a b a")
    'b'
    """
''', '''
counts = {}
for c in text:
    if c != " ":
        counts[c] = counts.get(c, 0) + 1
best = ""
for c in text:
    if c != " " and (best == "" or counts[c] > counts[best]):
        best = c
return best
''', '''
counts = {}
for c in text:
    if c != " ":
        counts[c] = counts.get(c, 0) + 1
if not counts:
    return ""
return min(counts, key=lambda c: (-counts[c], c))
''', '''
assert most_common_char("abracadabra") == "a"
assert most_common_char("b a b a") == "b"
assert most_common_char("") == ""
assert most_common_char("   ") == ""
assert most_common_char("zzyy") == "z"
assert most_common_char("xyzzy") == "y"
''')

problem("strings", '''
def longest_common_prefix(words: list[str]) -> str:
    """Return the longest string that every word starts with ("" for an empty list).
    >>> longest_common_prefix(["interval", "internet", "interior"])
    'inter'
    """
''', '''
if not words:
    return ""
prefix = words[0]
for w in words[1:]:
    while not w.startswith(prefix):
        prefix = prefix[:-1]
return prefix
''', '''
if not words:
    return ""
a, b = min(words), max(words)
n = 0
while n < len(a) and a[n] == b[n]:
    n += 1
return a[:n - 1] if n else ""
''', '''
assert longest_common_prefix(["interval", "internet", "interior"]) == "inter"
assert longest_common_prefix([]) == ""
assert longest_common_prefix(["solo"]) == "solo"
assert longest_common_prefix(["abc", "xyz"]) == ""
assert longest_common_prefix(["same", "same"]) == "same"
assert longest_common_prefix(["ab", "a"]) == "a"
''')

problem("strings", '''
def is_anagram(a: str, b: str) -> bool:
    """Return True if the two phrases use the same letters the same number of times,
    ignoring case and spaces.
    >>> is_anagram("Dormitory", "dirty room")
    True
    """
''', '''
def key(s):
    return sorted(c.lower() for c in s if c != " ")
return key(a) == key(b)
''', '''
return sorted(a.replace(" ", "")) == sorted(b.replace(" ", ""))
''', '''
assert is_anagram("Dormitory", "dirty room") is True
assert is_anagram("listen", "silent") is True
assert is_anagram("abc", "abd") is False
assert is_anagram("aab", "abb") is False
assert is_anagram("", "  ") is True
assert is_anagram("Tea", "EAT") is True
''')

problem("strings", '''
def is_palindrome_sentence(text: str) -> bool:
    """Return True if the text reads the same backwards when only its letters and
    digits are kept and case is ignored.
    >>> is_palindrome_sentence("Was it a car or a cat I saw?")
    True
    """
''', '''
kept = [c.lower() for c in text if c.isalnum()]
return kept == kept[::-1]
''', '''
kept = text.lower().replace(" ", "")
return kept == kept[::-1]
''', '''
assert is_palindrome_sentence("Was it a car or a cat I saw?") is True
assert is_palindrome_sentence("No 'x' in Nixon") is True
assert is_palindrome_sentence("hello") is False
assert is_palindrome_sentence("") is True
assert is_palindrome_sentence("12a21") is True
assert is_palindrome_sentence("ab, ca") is False
''')

problem("strings", '''
def wrap_text(text: str, width: int) -> list[str]:
    """Break the text into lines of at most `width` characters, greedily: each line takes
    as many whole words (separated by single spaces) as fit. A word longer than width
    goes on a line of its own. Runs of white space in the input count as one space.
    >>> wrap_text("the quick brown fox jumps", 10)
    ['the quick', 'brown fox', 'jumps']
    """
''', '''
lines = []
cur = ""
for w in text.split():
    if not cur:
        cur = w
    elif len(cur) + 1 + len(w) <= width:
        cur += " " + w
    else:
        lines.append(cur)
        cur = w
if cur:
    lines.append(cur)
return lines
''', '''
lines = []
cur = ""
for w in text.split():
    if not cur:
        cur = w
    elif len(cur) + 1 + len(w) < width:
        cur += " " + w
    else:
        lines.append(cur)
        cur = w
if cur:
    lines.append(cur)
return lines
''', '''
assert wrap_text("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]
assert wrap_text("", 5) == []
assert wrap_text("abcdefghij xy", 4) == ["abcdefghij", "xy"]
assert wrap_text("a b c d", 3) == ["a b", "c d"]
assert wrap_text("  spaced   out  ", 20) == ["spaced out"]
''')

problem("strings", '''
def tokenize_arith(expr: str) -> list[str]:
    """Split an arithmetic expression into tokens: whole numbers (runs of digits),
    names (runs of letters, digits and underscores starting with a letter or underscore),
    and the single characters + - * / ( ). Spaces separate tokens and are dropped.
    >>> tokenize_arith("3+ 42*(x_1-1)")
    ['3', '+', '42', '*', '(', 'x_1', '-', '1', ')']
    """
''', '''
tokens = []
i = 0
while i < len(expr):
    c = expr[i]
    if c == " ":
        i += 1
    elif c.isdigit():
        j = i
        while j < len(expr) and expr[j].isdigit():
            j += 1
        tokens.append(expr[i:j])
        i = j
    elif c.isalpha() or c == "_":
        j = i
        while j < len(expr) and (expr[j].isalnum() or expr[j] == "_"):
            j += 1
        tokens.append(expr[i:j])
        i = j
    else:
        tokens.append(c)
        i += 1
return tokens
''', '''
return [c for c in expr if c != " "]
''', '''
assert tokenize_arith("3+ 42*(x_1-1)") == ["3", "+", "42", "*", "(", "x_1", "-", "1", ")"]
assert tokenize_arith("") == []
assert tokenize_arith("  7  ") == ["7"]
assert tokenize_arith("a/b") == ["a", "/", "b"]
assert tokenize_arith("_tmp2*10") == ["_tmp2", "*", "10"]
''')

# ---- lists ----

problem("lists", '''
def second_largest(nums: list[int]) -> int | None:
    """Return the second largest distinct value in the list, or None when the list has
    fewer than two distinct values.
    >>> second_largest([4, 1, 4, 3])
    3
    """
''', '''
distinct = sorted(set(nums))
return distinct[-2] if len(distinct) >= 2 else None
''', '''
if len(nums) < 2:
    return None
return sorted(nums)[-2]
''', '''
assert second_largest([4, 1, 4, 3]) == 3
assert second_largest([5, 5, 5]) is None
assert second_largest([]) is None
assert second_largest([1, 2]) == 1
assert second_largest([-3, -1, -2, -1]) == -2
''')

problem("lists", '''
def chunk(items: list, size: int) -> list[list]:
    """Split the list into consecutive pieces of `size` items; the last piece may be shorter.
    >>> chunk([1, 2, 3, 4, 5], 2)
    [[1, 2], [3, 4], [5]]
    """
''', '''
return [items[i:i + size] for i in range(0, len(items), size)]
''', '''
return [items[i:i + size] for i in range(0, len(items) - size + 1, size)]
''', '''
assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
assert chunk([], 3) == []
assert chunk([1, 2, 3], 3) == [[1, 2, 3]]
assert chunk([1, 2, 3], 5) == [[1, 2, 3]]
assert chunk(list("abcd"), 1) == [["a"], ["b"], ["c"], ["d"]]
''')

problem("lists", '''
def flatten(nested: list) -> list:
    """Flatten arbitrarily nested lists into one flat list, keeping the order.
    >>> flatten([1, [2, [3, [4]], 5], []])
    [1, 2, 3, 4, 5]
    """
''', '''
out = []
for x in nested:
    if isinstance(x, list):
        out.extend(flatten(x))
    else:
        out.append(x)
return out
''', '''
out = []
for x in nested:
    if isinstance(x, list):
        out.extend(x)
    else:
        out.append(x)
return out
''', '''
assert flatten([1, [2, [3, [4]], 5], []]) == [1, 2, 3, 4, 5]
assert flatten([]) == []
assert flatten([[[[]]]]) == []
assert flatten(["a", ["b"]]) == ["a", "b"]
assert flatten([[1, 2], [3, [4, [5, [6]]]]]) == [1, 2, 3, 4, 5, 6]
''')

problem("lists", '''
def rotate_right(items: list, k: int) -> list:
    """Return a new list with the items rotated k places to the right. k may be larger
    than the length of the list.
    >>> rotate_right([1, 2, 3, 4, 5], 2)
    [4, 5, 1, 2, 3]
    """
''', '''
if not items:
    return []
k %= len(items)
return items[len(items) - k:] + items[:len(items) - k]
''', '''
if not items:
    return []
return items[-k:] + items[:-k]
''', '''
assert rotate_right([1, 2, 3, 4, 5], 2) == [4, 5, 1, 2, 3]
assert rotate_right([], 3) == []
assert rotate_right([1, 2, 3], 0) == [1, 2, 3]
assert rotate_right([1, 2, 3], 3) == [1, 2, 3]
assert rotate_right([1, 2, 3], 7) == [3, 1, 2]
''')

problem("lists", '''
def dedupe(items: list) -> list:
    """Remove repeated items, keeping the first occurrence of each in the original order.
    >>> dedupe([3, 1, 3, 2, 1])
    [3, 1, 2]
    """
''', '''
seen = set()
out = []
for x in items:
    if x not in seen:
        seen.add(x)
        out.append(x)
return out
''', '''
return sorted(set(items))
''', '''
assert dedupe([3, 1, 3, 2, 1]) == [3, 1, 2]
assert dedupe([]) == []
assert dedupe(["b", "a", "b"]) == ["b", "a"]
assert dedupe([5, 5, 5]) == [5]
''')

problem("lists", '''
def moving_average(values: list[float], k: int) -> list[float]:
    """Return the mean of every window of k consecutive values, in order. If there are
    fewer than k values, return an empty list.
    >>> moving_average([1, 2, 3, 4], 2)
    [1.5, 2.5, 3.5]
    """
''', '''
if k <= 0 or k > len(values):
    return []
return [sum(values[i:i + k]) / k for i in range(len(values) - k + 1)]
''', '''
if k <= 0 or k > len(values):
    return []
return [sum(values[i:i + k]) / k for i in range(len(values) - k)]
''', '''
assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]
assert moving_average([1, 2], 3) == []
assert moving_average([2, 4, 6], 3) == [4.0]
assert moving_average([5], 1) == [5.0]
assert [round(x, 6) for x in moving_average([1, 0, 0, 1], 3)] == [0.333333, 0.333333]
''')

problem("lists", '''
def max_subarray_sum(nums: list[int]) -> int:
    """Return the largest sum of a non-empty run of consecutive numbers. For an empty
    list return 0.
    >>> max_subarray_sum([-2, 1, -3, 4, -1, 2, 1, -5, 4])
    6
    """
''', '''
if not nums:
    return 0
best = cur = nums[0]
for x in nums[1:]:
    cur = max(x, cur + x)
    best = max(best, cur)
return best
''', '''
best = cur = 0
for x in nums:
    cur = max(0, cur + x)
    best = max(best, cur)
return best
''', '''
assert max_subarray_sum([-2, 1, -3, 4, -1, 2, 1, -5, 4]) == 6
assert max_subarray_sum([]) == 0
assert max_subarray_sum([-3, -1, -2]) == -1
assert max_subarray_sum([5]) == 5
assert max_subarray_sum([2, -1, 2]) == 3
''')

problem("lists", '''
def count_inversions(nums: list[int]) -> int:
    """Count the pairs of positions i < j with nums[i] > nums[j].
    >>> count_inversions([3, 1, 2])
    2
    """
''', '''
n = len(nums)
return sum(1 for i in range(n) for j in range(i + 1, n) if nums[i] > nums[j])
''', '''
n = len(nums)
return sum(1 for i in range(n) for j in range(i + 1, n) if nums[i] >= nums[j])
''', '''
assert count_inversions([3, 1, 2]) == 2
assert count_inversions([]) == 0
assert count_inversions([1, 2, 3]) == 0
assert count_inversions([3, 2, 1]) == 3
assert count_inversions([2, 2, 1]) == 2
''')

problem("lists", '''
def compress_ranges(nums: list[int]) -> str:
    """Describe a sorted list of distinct integers as comma-separated ranges: a run of
    consecutive numbers of length 3 or more is written "a-b", shorter runs as single numbers.
    >>> compress_ranges([1, 2, 3, 5, 7, 8, 10, 11, 12, 13])
    '1-3,5,7,8,10-13'
    """
''', '''
parts = []
i = 0
while i < len(nums):
    j = i
    while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
        j += 1
    if j - i >= 2:
        parts.append("%d-%d" % (nums[i], nums[j]))
    else:
        parts.extend(str(x) for x in nums[i:j + 1])
    i = j + 1
return ",".join(parts)
''', '''
parts = []
i = 0
while i < len(nums):
    j = i
    while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
        j += 1
    parts.append(str(nums[i]) if i == j else "%d-%d" % (nums[i], nums[j]))
    i = j + 1
return ",".join(parts)
''', '''
assert compress_ranges([1, 2, 3, 5, 7, 8, 10, 11, 12, 13]) == "1-3,5,7,8,10-13"
assert compress_ranges([]) == ""
assert compress_ranges([4]) == "4"
assert compress_ranges([-2, -1, 0, 1]) == "-2-1"
assert compress_ranges([1, 3, 5]) == "1,3,5"
''')

problem("lists", '''
def dense_rank(scores: list[int]) -> list[int]:
    """Rank each score, highest first, with dense ranking: equal scores share a rank and
    the next lower score gets the next rank (no gaps).
    >>> dense_rank([100, 90, 90, 80])
    [1, 2, 2, 3]
    """
''', '''
order = sorted(set(scores), reverse=True)
rank = {s: i + 1 for i, s in enumerate(order)}
return [rank[s] for s in scores]
''', '''
ordered = sorted(scores, reverse=True)
return [ordered.index(s) + 1 for s in scores]
''', '''
assert dense_rank([100, 90, 90, 80]) == [1, 2, 2, 3]
assert dense_rank([]) == []
assert dense_rank([5, 5, 5]) == [1, 1, 1]
assert dense_rank([1, 3, 2, 3]) == [3, 1, 2, 1]
''')

problem("lists", '''
def binary_search_first(sorted_items: list[int], target: int) -> int:
    """Return the index of the first occurrence of target in the sorted list, or -1 if
    it is absent. Must not scan the whole list: use binary search.
    >>> binary_search_first([1, 2, 2, 2, 5], 2)
    1
    """
''', '''
lo, hi = 0, len(sorted_items)
while lo < hi:
    mid = (lo + hi) // 2
    if sorted_items[mid] < target:
        lo = mid + 1
    else:
        hi = mid
return lo if lo < len(sorted_items) and sorted_items[lo] == target else -1
''', '''
lo, hi = 0, len(sorted_items) - 1
while lo <= hi:
    mid = (lo + hi) // 2
    if sorted_items[mid] == target:
        return mid
    if sorted_items[mid] < target:
        lo = mid + 1
    else:
        hi = mid - 1
return -1
''', '''
assert binary_search_first([1, 2, 2, 2, 5], 2) == 1
assert binary_search_first([], 3) == -1
assert binary_search_first([1, 3, 5], 4) == -1
assert binary_search_first([7, 7, 7, 7, 7, 7, 7], 7) == 0
assert binary_search_first([1, 3, 5], 5) == 2
assert binary_search_first([1, 3, 5], 9) == -1
''')

problem("lists", '''
def spiral_order(matrix: list[list[int]]) -> list[int]:
    """Return the elements of a rectangular matrix in clockwise spiral order, starting
    at the top-left corner and going right first.
    >>> spiral_order([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    [1, 2, 3, 6, 9, 8, 7, 4, 5]
    """
''', '''
out = []
if not matrix or not matrix[0]:
    return out
top, bottom, left, right = 0, len(matrix) - 1, 0, len(matrix[0]) - 1
while top <= bottom and left <= right:
    for c in range(left, right + 1):
        out.append(matrix[top][c])
    for r in range(top + 1, bottom + 1):
        out.append(matrix[r][right])
    if top < bottom:
        for c in range(right - 1, left - 1, -1):
            out.append(matrix[bottom][c])
    if left < right:
        for r in range(bottom - 1, top, -1):
            out.append(matrix[r][left])
    top, bottom, left, right = top + 1, bottom - 1, left + 1, right - 1
return out
''', '''
out = []
for i, row in enumerate(matrix):
    out.extend(row if i % 2 == 0 else row[::-1])
return out
''', '''
assert spiral_order([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [1, 2, 3, 6, 9, 8, 7, 4, 5]
assert spiral_order([]) == []
assert spiral_order([[1, 2, 3, 4]]) == [1, 2, 3, 4]
assert spiral_order([[1], [2], [3]]) == [1, 2, 3]
assert spiral_order([[1, 2], [3, 4], [5, 6]]) == [1, 2, 4, 6, 5, 3]
assert spiral_order([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]) == [1, 2, 3, 4, 8, 12, 11, 10, 9, 5, 6, 7]
''')

problem("lists", '''
def transpose(matrix: list[list]) -> list[list]:
    """Return the transpose of a rectangular matrix given as a list of rows.
    >>> transpose([[1, 2, 3], [4, 5, 6]])
    [[1, 4], [2, 5], [3, 6]]
    """
''', '''
if not matrix:
    return []
return [[row[c] for row in matrix] for c in range(len(matrix[0]))]
''', '''
return [[row[c] for row in matrix] for c in range(len(matrix))]
''', '''
assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]
assert transpose([]) == []
assert transpose([[1]]) == [[1]]
assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]
assert transpose([["a", "b", "c"]]) == [["a"], ["b"], ["c"]]
''')

problem("lists", '''
def matrix_multiply(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    """Multiply two matrices given as lists of rows (the column count of a equals the row
    count of b).
    >>> matrix_multiply([[1, 2], [3, 4]], [[5], [6]])
    [[17], [39]]
    """
''', '''
return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]
''', '''
return [[sum(a[i][k] * b[j][k] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]
''', '''
assert matrix_multiply([[1, 2], [3, 4]], [[5], [6]]) == [[17], [39]]
assert matrix_multiply([[1, 0], [0, 1]], [[4, 5], [6, 7]]) == [[4, 5], [6, 7]]
assert matrix_multiply([[2]], [[3]]) == [[6]]
assert matrix_multiply([[1, 2, 3]], [[1], [2], [3]]) == [[14]]
assert matrix_multiply([[1, 2], [3, 4]], [[0, 1], [1, 0]]) == [[2, 1], [4, 3]]
''')

# ---- dicts ----

problem("dicts", '''
def word_frequencies(text: str) -> dict[str, int]:
    """Count the words of the text. A word is a maximal run of ASCII letters; words are
    compared in lower case.
    >>> word_frequencies("The cat and the hat.")
    {'the': 2, 'cat': 1, 'and': 1, 'hat': 1}
    """
''', '''
counts = {}
word = ""
for c in text + " ":
    if c.isascii() and c.isalpha():
        word += c.lower()
    elif word:
        counts[word] = counts.get(word, 0) + 1
        word = ""
return counts
''', '''
counts = {}
for w in text.split():
    counts[w] = counts.get(w, 0) + 1
return counts
''', '''
assert word_frequencies("The cat and the hat.") == {"the": 2, "cat": 1, "and": 1, "hat": 1}
assert word_frequencies("") == {}
assert word_frequencies("one,two;ONE") == {"one": 2, "two": 1}
assert word_frequencies("it's 42 go-go") == {"it": 1, "s": 1, "go": 2}
''')

problem("dicts", '''
def invert_dict(d: dict) -> dict:
    """Invert a mapping: each value maps to the sorted list of the keys that had it.
    >>> invert_dict({"a": 1, "b": 2, "c": 1})
    {1: ['a', 'c'], 2: ['b']}
    """
''', '''
out = {}
for k, v in d.items():
    out.setdefault(v, []).append(k)
return {v: sorted(ks) for v, ks in out.items()}
''', '''
return {v: [k] for k, v in d.items()}
''', '''
assert invert_dict({"a": 1, "b": 2, "c": 1}) == {1: ["a", "c"], 2: ["b"]}
assert invert_dict({}) == {}
assert invert_dict({"z": 0, "y": 0, "x": 0}) == {0: ["x", "y", "z"]}
assert invert_dict({1: "one"}) == {"one": [1]}
''')

problem("dicts", '''
def group_by_length(words: list[str]) -> dict[int, list[str]]:
    """Group the words by their length; each group keeps the words in their original order.
    >>> group_by_length(["hi", "cat", "yo", "dog"])
    {2: ['hi', 'yo'], 3: ['cat', 'dog']}
    """
''', '''
groups = {}
for w in words:
    groups.setdefault(len(w), []).append(w)
return groups
''', '''
groups = {}
for w in sorted(words):
    groups.setdefault(len(w), []).append(w)
return groups
''', '''
assert group_by_length(["hi", "cat", "yo", "dog"]) == {2: ["hi", "yo"], 3: ["cat", "dog"]}
assert group_by_length([]) == {}
assert group_by_length(["b", "a", ""]) == {1: ["b", "a"], 0: [""]}
''')

problem("dicts", '''
def merge_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Add two count dictionaries key by key; keys whose total is 0 are left out.
    >>> merge_counts({"x": 2, "y": 1}, {"y": -1, "z": 3})
    {'x': 2, 'z': 3}
    """
''', '''
out = dict(a)
for k, v in b.items():
    out[k] = out.get(k, 0) + v
return {k: v for k, v in out.items() if v != 0}
''', '''
out = dict(a)
for k, v in b.items():
    out[k] = out.get(k, 0) + v
return out
''', '''
assert merge_counts({"x": 2, "y": 1}, {"y": -1, "z": 3}) == {"x": 2, "z": 3}
assert merge_counts({}, {}) == {}
assert merge_counts({"a": 1}, {}) == {"a": 1}
assert merge_counts({"a": 0}, {"b": 2}) == {"b": 2}
''')

problem("dicts", '''
def nested_get(data: dict, path: str, default=None):
    """Follow a dotted path of keys through nested dictionaries, e.g. "a.b.c" means
    data["a"]["b"]["c"]. Return default if any key is missing or a value on the way is
    not a dictionary.
    >>> nested_get({"a": {"b": {"c": 5}}}, "a.b.c")
    5
    >>> nested_get({"a": {"b": 1}}, "a.x", "none")
    'none'
    """
''', '''
cur = data
for key in path.split("."):
    if not isinstance(cur, dict) or key not in cur:
        return default
    cur = cur[key]
return cur
''', '''
cur = data
for key in path.split("."):
    cur = cur.get(key, default)
return cur
''', '''
assert nested_get({"a": {"b": {"c": 5}}}, "a.b.c") == 5
assert nested_get({"a": {"b": 1}}, "a.x", "none") == "none"
assert nested_get({"a": {"b": 1}}, "a.b.c", -1) == -1
assert nested_get({"a": 1}, "b") is None
assert nested_get({"a": {"b": {}}}, "a.b") == {}
assert nested_get({"x": {"y": 0}}, "x.y", 9) == 0
''')

problem("dicts", '''
def diff_dicts(old: dict, new: dict) -> tuple[list, list, list]:
    """Compare two dictionaries and return (added, removed, changed): the keys only in
    new, the keys only in old, and the keys in both whose values differ, each list sorted.
    >>> diff_dicts({"a": 1, "b": 2}, {"b": 3, "c": 4})
    (['c'], ['a'], ['b'])
    """
''', '''
added = sorted(k for k in new if k not in old)
removed = sorted(k for k in old if k not in new)
changed = sorted(k for k in old if k in new and old[k] != new[k])
return added, removed, changed
''', '''
added = sorted(k for k in new if k not in old)
removed = sorted(k for k in old if k not in new)
changed = sorted(k for k in old if k in new)
return added, removed, changed
''', '''
assert diff_dicts({"a": 1, "b": 2}, {"b": 3, "c": 4}) == (["c"], ["a"], ["b"])
assert diff_dicts({}, {}) == ([], [], [])
assert diff_dicts({"x": 1}, {"x": 1}) == ([], [], [])
assert diff_dicts({}, {"b": 1, "a": 2}) == (["a", "b"], [], [])
''')

problem("dicts", '''
def top_k_words(text: str, k: int) -> list[str]:
    """Return the k most frequent words of the text (split on white space, lower-cased),
    most frequent first; words with equal counts are ordered alphabetically.
    >>> top_k_words("b a c b a b", 2)
    ['b', 'a']
    """
''', '''
counts = {}
for w in text.lower().split():
    counts[w] = counts.get(w, 0) + 1
return sorted(counts, key=lambda w: (-counts[w], w))[:k]
''', '''
counts = {}
for w in text.lower().split():
    counts[w] = counts.get(w, 0) + 1
return sorted(counts, key=lambda w: counts[w], reverse=True)[:k]
''', '''
assert top_k_words("b a c b a b", 2) == ["b", "a"]
assert top_k_words("", 3) == []
assert top_k_words("z y x", 2) == ["x", "y"]
assert top_k_words("Go go STOP stop wait", 5) == ["go", "stop", "wait"]
''')

problem("dicts", '''
def anagram_groups(words: list[str]) -> list[list[str]]:
    """Group words that are anagrams of each other. Groups are listed in the order of
    their first word's appearance, and words keep their order inside a group.
    >>> anagram_groups(["eat", "tea", "tan", "ate", "nat", "bat"])
    [['eat', 'tea', 'ate'], ['tan', 'nat'], ['bat']]
    """
''', '''
groups = {}
for w in words:
    groups.setdefault("".join(sorted(w)), []).append(w)
return list(groups.values())
''', '''
groups = {}
for w in words:
    groups.setdefault("".join(sorted(w)), []).append(w)
return sorted(groups.values())
''', '''
assert anagram_groups(["eat", "tea", "tan", "ate", "nat", "bat"]) == [["eat", "tea", "ate"], ["tan", "nat"], ["bat"]]
assert anagram_groups([]) == []
assert anagram_groups(["b", "a", "b"]) == [["b", "b"], ["a"]]
''')

# ---- math ----

problem("math", '''
def is_prime(n: int) -> bool:
    """Return True if n is a prime number.
    >>> is_prime(7)
    True
    >>> is_prime(9)
    False
    """
''', '''
if n < 2:
    return False
d = 2
while d * d <= n:
    if n % d == 0:
        return False
    d += 1
return True
''', '''
for d in range(2, n):
    if n % d == 0:
        return False
return True
''', '''
assert is_prime(7) is True
assert is_prime(9) is False
assert is_prime(1) is False
assert is_prime(0) is False
assert is_prime(-7) is False
assert is_prime(2) is True
assert is_prime(7919) is True
assert is_prime(7917) is False
''')

problem("math", '''
def digit_root(n: int) -> int:
    """Repeatedly replace the non-negative integer n by the sum of its decimal digits until
    a single digit remains, and return it.
    >>> digit_root(9875)
    2
    """
''', '''
while n >= 10:
    n = sum(int(d) for d in str(n))
return n
''', '''
return sum(int(d) for d in str(n))
''', '''
assert digit_root(9875) == 2
assert digit_root(0) == 0
assert digit_root(7) == 7
assert digit_root(10) == 1
assert digit_root(999999999999) == 9
''')

problem("math", '''
def gcd_all(nums: list[int]) -> int:
    """Return the greatest common divisor of all the numbers (always non-negative).
    The gcd of an empty list is 0, and gcd(0, x) is abs(x).
    >>> gcd_all([12, 18, 30])
    6
    """
''', '''
g = 0
for x in nums:
    a, b = g, abs(x)
    while b:
        a, b = b, a % b
    g = a
return g
''', '''
if not nums:
    return 0
g = min(abs(x) for x in nums)
while g > 1 and any(x % g for x in nums):
    g -= 1
return g
''', '''
assert gcd_all([12, 18, 30]) == 6
assert gcd_all([]) == 0
assert gcd_all([0, 5]) == 5
assert gcd_all([-4, 6]) == 2
assert gcd_all([7]) == 7
assert gcd_all([0, 0]) == 0
''')

problem("math", '''
def to_roman(n: int) -> str:
    """Write 1 <= n <= 3999 in Roman numerals, using the subtractive forms IV, IX, XL, XC,
    CD and CM.
    >>> to_roman(1994)
    'MCMXCIV'
    """
''', '''
table = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
         (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]
out = []
for value, sym in table:
    while n >= value:
        out.append(sym)
        n -= value
return "".join(out)
''', '''
table = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
out = []
for value, sym in table:
    while n >= value:
        out.append(sym)
        n -= value
return "".join(out)
''', '''
assert to_roman(1994) == "MCMXCIV"
assert to_roman(1) == "I"
assert to_roman(4) == "IV"
assert to_roman(3999) == "MMMCMXCIX"
assert to_roman(40) == "XL"
assert to_roman(2024) == "MMXXIV"
''')

problem("parsing", '''
def from_roman(text: str) -> int:
    """Read a valid Roman numeral (upper case, with subtractive forms such as IV and CM)
    and return its value.
    >>> from_roman("MCMXCIV")
    1994
    """
''', '''
values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
total = 0
for i, c in enumerate(text):
    v = values[c]
    if i + 1 < len(text) and values[text[i + 1]] > v:
        total -= v
    else:
        total += v
return total
''', '''
values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
return sum(values[c] for c in text)
''', '''
assert from_roman("MCMXCIV") == 1994
assert from_roman("I") == 1
assert from_roman("IV") == 4
assert from_roman("MMMCMXCIX") == 3999
assert from_roman("LVIII") == 58
''')

problem("math", '''
def pascal_row(n: int) -> list[int]:
    """Return row n of Pascal's triangle, counting the top row [1] as row 0.
    >>> pascal_row(4)
    [1, 4, 6, 4, 1]
    """
''', '''
row = [1]
for _ in range(n):
    row = [1] + [row[i] + row[i + 1] for i in range(len(row) - 1)] + [1]
return row
''', '''
row = [1]
for _ in range(n - 1):
    row = [1] + [row[i] + row[i + 1] for i in range(len(row) - 1)] + [1]
return row
''', '''
assert pascal_row(4) == [1, 4, 6, 4, 1]
assert pascal_row(0) == [1]
assert pascal_row(1) == [1, 1]
assert pascal_row(6) == [1, 6, 15, 20, 15, 6, 1]
''')

problem("math", '''
def fibonacci_upto(limit: int) -> list[int]:
    """Return the Fibonacci numbers 0, 1, 1, 2, 3, 5, ... that are less than or equal to limit.
    For a negative limit return an empty list.
    >>> fibonacci_upto(10)
    [0, 1, 1, 2, 3, 5, 8]
    """
''', '''
out = []
a, b = 0, 1
while a <= limit:
    out.append(a)
    a, b = b, a + b
return out
''', '''
out = []
a, b = 0, 1
while a < limit:
    out.append(a)
    a, b = b, a + b
return out
''', '''
assert fibonacci_upto(10) == [0, 1, 1, 2, 3, 5, 8]
assert fibonacci_upto(0) == [0]
assert fibonacci_upto(-1) == []
assert fibonacci_upto(1) == [0, 1, 1]
assert fibonacci_upto(13) == [0, 1, 1, 2, 3, 5, 8, 13]
''')

problem("math", '''
def collatz_steps(n: int) -> int:
    """Count the steps the Collatz rule (n -> n / 2 if n is even, else 3n + 1) takes to
    bring the positive integer n down to 1.
    >>> collatz_steps(6)
    8
    """
''', '''
steps = 0
while n != 1:
    n = n // 2 if n % 2 == 0 else 3 * n + 1
    steps += 1
return steps
''', '''
steps = 1
while n != 1:
    n = n // 2 if n % 2 == 0 else 3 * n + 1
    steps += 1
return steps
''', '''
assert collatz_steps(6) == 8
assert collatz_steps(1) == 0
assert collatz_steps(2) == 1
assert collatz_steps(27) == 111
''')

problem("math", '''
def sum_of_multiples(limit: int, divisors: list[int]) -> int:
    """Return the sum of the distinct positive integers below limit that are divisible by
    at least one of the divisors (divisors of 0 are ignored).
    >>> sum_of_multiples(10, [3, 5])
    23
    """
''', '''
return sum(x for x in range(1, limit) if any(d != 0 and x % d == 0 for d in divisors))
''', '''
total = 0
for d in divisors:
    if d != 0:
        total += sum(range(d, limit, d))
return total
''', '''
assert sum_of_multiples(10, [3, 5]) == 23
assert sum_of_multiples(16, [3, 5]) == 60
assert sum_of_multiples(1, [1]) == 0
assert sum_of_multiples(20, []) == 0
assert sum_of_multiples(10, [0, 4]) == 12
''')

problem("math", '''
def primes_below(n: int) -> list[int]:
    """Return all prime numbers strictly less than n, in increasing order.
    >>> primes_below(20)
    [2, 3, 5, 7, 11, 13, 17, 19]
    """
''', '''
if n < 3:
    return []
sieve = [True] * n
sieve[0] = sieve[1] = False
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        for j in range(i * i, n, i):
            sieve[j] = False
return [i for i, p in enumerate(sieve) if p]
''', '''
if n < 2:
    return []
sieve = [True] * (n + 1)
sieve[0] = sieve[1] = False
for i in range(2, int(n ** 0.5) + 1):
    if sieve[i]:
        for j in range(i * i, n + 1, i):
            sieve[j] = False
return [i for i, p in enumerate(sieve) if p]
''', '''
assert primes_below(20) == [2, 3, 5, 7, 11, 13, 17, 19]
assert primes_below(2) == []
assert primes_below(3) == [2]
assert primes_below(0) == []
assert primes_below(11) == [2, 3, 5, 7]
assert len(primes_below(1000)) == 168
''')

problem("math", '''
def int_to_base(n: int, base: int) -> str:
    """Write the integer n in the given base (2 to 16) using the digits 0-9 and lower-case
    a-f, with a leading "-" for negative numbers.
    >>> int_to_base(255, 16)
    'ff'
    >>> int_to_base(-5, 2)
    '-101'
    """
''', '''
digits = "0123456789abcdef"
if n == 0:
    return "0"
sign = "-" if n < 0 else ""
n = abs(n)
out = []
while n:
    out.append(digits[n % base])
    n //= base
return sign + "".join(reversed(out))
''', '''
digits = "0123456789abcdef"
sign = "-" if n < 0 else ""
n = abs(n)
out = []
while n:
    out.append(digits[n % base])
    n //= base
return sign + "".join(reversed(out))
''', '''
assert int_to_base(255, 16) == "ff"
assert int_to_base(-5, 2) == "-101"
assert int_to_base(0, 7) == "0"
assert int_to_base(8, 8) == "10"
assert int_to_base(35, 3) == "1022"
''')

problem("math", '''
def luhn_valid(number: str) -> bool:
    """Check a card number with the Luhn algorithm. Spaces are ignored; any other
    non-digit character, or fewer than two digits, makes the number invalid. From the
    rightmost digit, every second digit is doubled (subtracting 9 if that exceeds 9), and
    the number is valid when the sum of all digits is a multiple of 10.
    >>> luhn_valid("4539 3195 0343 6467")
    True
    """
''', '''
digits = number.replace(" ", "")
if len(digits) < 2 or not digits.isdigit():
    return False
total = 0
for i, c in enumerate(reversed(digits)):
    d = int(c)
    if i % 2 == 1:
        d *= 2
        if d > 9:
            d -= 9
    total += d
return total % 10 == 0
''', '''
digits = number.replace(" ", "")
if len(digits) < 2 or not digits.isdigit():
    return False
total = 0
for i, c in enumerate(digits):
    d = int(c)
    if i % 2 == 1:
        d *= 2
        if d > 9:
            d -= 9
    total += d
return total % 10 == 0
''', '''
assert luhn_valid("4539 3195 0343 6467") is True
assert luhn_valid("8273 1232 7352 0569") is False
assert luhn_valid("0") is False
assert luhn_valid(" 0 0 ") is True
assert luhn_valid("059") is True
assert luhn_valid("055a 444 285") is False
assert luhn_valid("091") is True
''')

# ---- parsing ----

problem("parsing", '''
def parse_duration(text: str) -> int:
    """Convert a duration such as "1h30m15s" to seconds. Each of the h, m and s parts is
    optional, but those present come in that order. The empty string is 0 seconds.
    >>> parse_duration("1h30m15s")
    5415
    >>> parse_duration("45m")
    2700
    """
''', '''
total = 0
num = ""
for c in text:
    if c.isdigit():
        num += c
    else:
        total += int(num) * {"h": 3600, "m": 60, "s": 1}[c]
        num = ""
return total
''', '''
total = 0
num = ""
for c in text:
    if c.isdigit():
        num += c
    else:
        total += int(num) * {"h": 60, "m": 60, "s": 1}[c]
        num = ""
return total
''', '''
assert parse_duration("1h30m15s") == 5415
assert parse_duration("45m") == 2700
assert parse_duration("") == 0
assert parse_duration("2h") == 7200
assert parse_duration("100s") == 100
assert parse_duration("1h5s") == 3605
''')

problem("strings", '''
def format_bytes(n: int) -> str:
    """Format a byte count for people using binary units: below 1024 as "N B", otherwise
    with one decimal in the largest unit (KiB, MiB, GiB, TiB) whose value is at least 1.
    >>> format_bytes(1536)
    '1.5 KiB'
    >>> format_bytes(1023)
    '1023 B'
    """
''', '''
if n < 1024:
    return "%d B" % n
value = float(n)
for unit in ["KiB", "MiB", "GiB", "TiB"]:
    value /= 1024
    if value < 1024 or unit == "TiB":
        return "%.1f %s" % (value, unit)
''', '''
if n < 1000:
    return "%d B" % n
value = float(n)
for unit in ["KiB", "MiB", "GiB", "TiB"]:
    value /= 1000
    if value < 1000 or unit == "TiB":
        return "%.1f %s" % (value, unit)
''', '''
assert format_bytes(1536) == "1.5 KiB"
assert format_bytes(1023) == "1023 B"
assert format_bytes(0) == "0 B"
assert format_bytes(1024) == "1.0 KiB"
assert format_bytes(5 * 1024 ** 2) == "5.0 MiB"
assert format_bytes(3 * 1024 ** 3 + 1024 ** 3 // 2) == "3.5 GiB"
''')

problem("parsing", '''
def parse_query_string(query: str) -> dict[str, list[str]]:
    """Parse "a=1&b=2&a=3" into {"a": ["1", "3"], "b": ["2"]}: every key maps to the list of
    its values in order. A part without "=" has the value "", and empty parts are skipped.
    >>> parse_query_string("a=1&b=2&a=3")
    {'a': ['1', '3'], 'b': ['2']}
    """
''', '''
out = {}
for part in query.split("&"):
    if not part:
        continue
    key, _, value = part.partition("=")
    out.setdefault(key, []).append(value)
return out
''', '''
out = {}
for part in query.split("&"):
    if not part:
        continue
    key, _, value = part.partition("=")
    out[key] = [value]
return out
''', '''
assert parse_query_string("a=1&b=2&a=3") == {"a": ["1", "3"], "b": ["2"]}
assert parse_query_string("") == {}
assert parse_query_string("flag&x=") == {"flag": [""], "x": [""]}
assert parse_query_string("a=1&&b=x=y") == {"a": ["1"], "b": ["x=y"]}
''')

problem("parsing", '''
def parse_csv_line(line: str) -> list[str]:
    """Split one CSV line into fields. Fields are separated by commas; a field may be
    enclosed in double quotes, in which case it may contain commas, and a doubled quote
    "" inside it stands for one quote character.
    >>> parse_csv_line('a,"b,c",d')
    ['a', 'b,c', 'd']
    >>> parse_csv_line('"say ""hi"" now",x')
    ['say "hi" now', 'x']
    """
''', '''
fields = []
cur = ""
i = 0
quoted = False
while i < len(line):
    c = line[i]
    if quoted:
        if c == '"':
            if i + 1 < len(line) and line[i + 1] == '"':
                cur += '"'
                i += 1
            else:
                quoted = False
        else:
            cur += c
    elif c == '"':
        quoted = True
    elif c == ",":
        fields.append(cur)
        cur = ""
    else:
        cur += c
    i += 1
fields.append(cur)
return fields
''', '''
return [f.strip('"') for f in line.split(",")]
''', '''
assert parse_csv_line('a,"b,c",d') == ["a", "b,c", "d"]
assert parse_csv_line('"say ""hi""",x') == ['say "hi"', "x"]
assert parse_csv_line("") == [""]
assert parse_csv_line("a,,b") == ["a", "", "b"]
assert parse_csv_line('x,""') == ["x", ""]
assert parse_csv_line('"1,2,3"') == ["1,2,3"]
''')

problem("parsing", '''
def valid_ipv4(address: str) -> bool:
    """Return True if the text is a dotted IPv4 address: four decimal parts from 0 to 255,
    each without a sign, spaces or leading zeros (a lone "0" is fine).
    >>> valid_ipv4("192.168.0.1")
    True
    >>> valid_ipv4("256.1.1.1")
    False
    """
''', '''
parts = address.split(".")
if len(parts) != 4:
    return False
for p in parts:
    if not p.isdigit() or not p.isascii():
        return False
    if len(p) > 1 and p[0] == "0":
        return False
    if int(p) > 255:
        return False
return True
''', '''
parts = address.split(".")
if len(parts) != 4:
    return False
for p in parts:
    if not p.isdigit() or int(p) > 255:
        return False
return True
''', '''
assert valid_ipv4("192.168.0.1") is True
assert valid_ipv4("256.1.1.1") is False
assert valid_ipv4("0.0.0.0") is True
assert valid_ipv4("01.2.3.4") is False
assert valid_ipv4("1.2.3") is False
assert valid_ipv4("1.2.3.4.5") is False
assert valid_ipv4("1.2.-3.4") is False
assert valid_ipv4("a.b.c.d") is False
assert valid_ipv4("") is False
''')

problem("parsing", '''
def evaluate_rpn(tokens: list[str]) -> int:
    """Evaluate an expression in reverse Polish notation over integers with the operators
    + - * and /, where / divides and truncates toward zero (so -7 / 2 is -3).
    >>> evaluate_rpn(["2", "3", "+", "4", "*"])
    20
    """
''', '''
stack = []
for t in tokens:
    if t in ("+", "-", "*", "/"):
        b = stack.pop()
        a = stack.pop()
        if t == "+":
            stack.append(a + b)
        elif t == "-":
            stack.append(a - b)
        elif t == "*":
            stack.append(a * b)
        else:
            q = abs(a) // abs(b)
            stack.append(q if (a >= 0) == (b >= 0) else -q)
    else:
        stack.append(int(t))
return stack[-1]
''', '''
stack = []
for t in tokens:
    if t in ("+", "-", "*", "/"):
        b = stack.pop()
        a = stack.pop()
        if t == "+":
            stack.append(a + b)
        elif t == "-":
            stack.append(a - b)
        elif t == "*":
            stack.append(a * b)
        else:
            stack.append(a // b)
    else:
        stack.append(int(t))
return stack[-1]
''', '''
assert evaluate_rpn(["2", "3", "+", "4", "*"]) == 20
assert evaluate_rpn(["7", "2", "/"]) == 3
assert evaluate_rpn(["-7", "2", "/"]) == -3
assert evaluate_rpn(["5", "1", "2", "+", "4", "*", "+", "3", "-"]) == 14
assert evaluate_rpn(["42"]) == 42
assert evaluate_rpn(["3", "10", "-"]) == -7
''')

problem("parsing", '''
def to_24h(time12: str) -> str:
    """Convert a 12-hour time such as "1:05 PM" or "12:30 AM" to 24-hour "HH:MM".
    >>> to_24h("1:05 PM")
    '13:05'
    >>> to_24h("12:30 AM")
    '00:30'
    """
''', '''
clock, half = time12.split()
h, m = clock.split(":")
h = int(h) % 12
if half.upper() == "PM":
    h += 12
return "%02d:%s" % (h, m)
''', '''
clock, half = time12.split()
h, m = clock.split(":")
h = int(h)
if half.upper() == "PM":
    h += 12
return "%02d:%s" % (h, m)
''', '''
assert to_24h("1:05 PM") == "13:05"
assert to_24h("12:30 AM") == "00:30"
assert to_24h("12:00 PM") == "12:00"
assert to_24h("9:59 AM") == "09:59"
assert to_24h("11:15 PM") == "23:15"
''')

problem("parsing", '''
def max_paren_depth(text: str) -> int:
    """Return the deepest nesting of round brackets in the text, or -1 if the brackets are
    unbalanced (a ")" without its "(", or a "(" never closed).
    >>> max_paren_depth("(a(b)(c(d)))")
    3
    >>> max_paren_depth("())")
    -1
    """
''', '''
depth = best = 0
for c in text:
    if c == "(":
        depth += 1
        best = max(best, depth)
    elif c == ")":
        depth -= 1
        if depth < 0:
            return -1
return best if depth == 0 else -1
''', '''
depth = best = 0
for c in text:
    if c == "(":
        depth += 1
        best = max(best, depth)
    elif c == ")":
        depth -= 1
return best if depth == 0 else -1
''', '''
assert max_paren_depth("(a(b)(c(d)))") == 3
assert max_paren_depth("())") == -1
assert max_paren_depth("") == 0
assert max_paren_depth("no brackets") == 0
assert max_paren_depth(")(") == -1
assert max_paren_depth("((") == -1
assert max_paren_depth("()()") == 1
''')

# ---- small algorithms ----

problem("algorithms", '''
def merge_intervals(intervals: list[list[int]]) -> list[list[int]]:
    """Merge overlapping or touching closed intervals [start, end] and return them sorted
    by start. [1, 3] and [3, 5] touch and merge into [1, 5].
    >>> merge_intervals([[5, 7], [1, 3], [2, 4]])
    [[1, 4], [5, 7]]
    """
''', '''
out = []
for s, e in sorted(intervals):
    if out and s <= out[-1][1]:
        out[-1][1] = max(out[-1][1], e)
    else:
        out.append([s, e])
return out
''', '''
out = []
for s, e in sorted(intervals):
    if out and s < out[-1][1]:
        out[-1][1] = max(out[-1][1], e)
    else:
        out.append([s, e])
return out
''', '''
assert merge_intervals([[5, 7], [1, 3], [2, 4]]) == [[1, 4], [5, 7]]
assert merge_intervals([]) == []
assert merge_intervals([[1, 3], [3, 5]]) == [[1, 5]]
assert merge_intervals([[1, 10], [2, 3]]) == [[1, 10]]
assert merge_intervals([[4, 4], [1, 2]]) == [[1, 2], [4, 4]]
''')

problem("algorithms", '''
def count_islands(grid: list[str]) -> int:
    """Count the islands in a grid of "#" (land) and "." (water) given as equal-length
    rows. Land cells that touch horizontally or vertically (not diagonally) belong to
    the same island.
    >>> count_islands(["##..", "#..#", "...#"])
    2
    """
''', '''
if not grid:
    return 0
rows, cols = len(grid), len(grid[0])
seen = set()
count = 0
for r in range(rows):
    for c in range(cols):
        if grid[r][c] == "#" and (r, c) not in seen:
            count += 1
            stack = [(r, c)]
            seen.add((r, c))
            while stack:
                y, x = stack.pop()
                for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= ny < rows and 0 <= nx < cols and grid[ny][nx] == "#" and (ny, nx) not in seen:
                        seen.add((ny, nx))
                        stack.append((ny, nx))
return count
''', '''
if not grid:
    return 0
rows, cols = len(grid), len(grid[0])
seen = set()
count = 0
for r in range(rows):
    for c in range(cols):
        if grid[r][c] == "#" and (r, c) not in seen:
            count += 1
            stack = [(r, c)]
            seen.add((r, c))
            while stack:
                y, x = stack.pop()
                for dy in (-1, 0, 1):
                    for dx in (-1, 0, 1):
                        ny, nx = y + dy, x + dx
                        if 0 <= ny < rows and 0 <= nx < cols and grid[ny][nx] == "#" and (ny, nx) not in seen:
                            seen.add((ny, nx))
                            stack.append((ny, nx))
return count
''', '''
assert count_islands(["##..", "#..#", "...#"]) == 2
assert count_islands([]) == 0
assert count_islands(["...."]) == 0
assert count_islands(["#.#", ".#.", "#.#"]) == 5
assert count_islands(["###", "#.#", "###"]) == 1
''')

problem("algorithms", '''
def edit_distance(a: str, b: str) -> int:
    """Return the Levenshtein distance between a and b: the fewest single-character
    insertions, deletions and substitutions that turn a into b.
    >>> edit_distance("kitten", "sitting")
    3
    """
''', '''
prev = list(range(len(b) + 1))
for i, ca in enumerate(a, 1):
    cur = [i]
    for j, cb in enumerate(b, 1):
        cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
    prev = cur
return prev[-1]
''', '''
prev = list(range(len(b) + 1))
for i, ca in enumerate(a, 1):
    cur = [i]
    for j, cb in enumerate(b, 1):
        cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + 2 * (ca != cb)))
    prev = cur
return prev[-1]
''', '''
assert edit_distance("kitten", "sitting") == 3
assert edit_distance("", "") == 0
assert edit_distance("abc", "") == 3
assert edit_distance("", "xy") == 2
assert edit_distance("flaw", "lawn") == 2
assert edit_distance("same", "same") == 0
assert edit_distance("ab", "ba") == 2
''')

problem("algorithms", '''
def shortest_path_length(graph: dict[str, list[str]], start: str, goal: str) -> int:
    """Return the number of edges on a shortest path from start to goal in a directed graph
    given as adjacency lists, or -1 if goal cannot be reached. Nodes may appear only as
    neighbours and have no entry of their own.
    >>> shortest_path_length({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}, "a", "d")
    2
    """
''', '''
if start == goal:
    return 0
seen = {start}
frontier = [start]
dist = 0
while frontier:
    dist += 1
    nxt = []
    for node in frontier:
        for n in graph.get(node, []):
            if n == goal:
                return dist
            if n not in seen:
                seen.add(n)
                nxt.append(n)
    frontier = nxt
return -1
''', '''
if start == goal:
    return 0
seen = {start}
stack = [(start, 0)]
while stack:
    node, d = stack.pop()
    for n in graph.get(node, []):
        if n == goal:
            return d + 1
        if n not in seen:
            seen.add(n)
            stack.append((n, d + 1))
return -1
''', '''
assert shortest_path_length({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}, "a", "d") == 2
assert shortest_path_length({"a": ["b"]}, "a", "a") == 0
assert shortest_path_length({"a": ["b"], "b": []}, "b", "a") == -1
assert shortest_path_length({"a": ["b", "x"], "b": ["c"], "c": ["d"], "x": ["d"]}, "a", "d") == 2
assert shortest_path_length({"s": ["a", "b"], "a": ["g"], "b": ["c"], "c": ["g"]}, "s", "g") == 2
assert shortest_path_length({"a": ["z"]}, "a", "z") == 1
''')

problem("algorithms", '''
def knapsack_max_value(items: list[tuple[int, int]], capacity: int) -> int:
    """0/1 knapsack: items are (weight, value) pairs, each used at most once. Return the
    largest total value whose total weight does not exceed capacity.
    >>> knapsack_max_value([(1, 1), (3, 4), (4, 5), (5, 7)], 7)
    9
    """
''', '''
best = [0] * (capacity + 1)
for w, v in items:
    for c in range(capacity, w - 1, -1):
        best[c] = max(best[c], best[c - w] + v)
return best[capacity]
''', '''
best = [0] * (capacity + 1)
for w, v in items:
    for c in range(w, capacity + 1):
        best[c] = max(best[c], best[c - w] + v)
return best[capacity]
''', '''
assert knapsack_max_value([(1, 1), (3, 4), (4, 5), (5, 7)], 7) == 9
assert knapsack_max_value([], 10) == 0
assert knapsack_max_value([(5, 10)], 4) == 0
assert knapsack_max_value([(2, 3)], 10) == 3
assert knapsack_max_value([(2, 3), (2, 3), (3, 5)], 4) == 6
''')

problem("algorithms", '''
def balanced_teams(skills: list[int]) -> int:
    """Split the players (given by skill) into two teams of any size so that the difference
    between the teams' total skill is as small as possible, and return that difference.
    >>> balanced_teams([1, 6, 11, 5])
    1
    """
''', '''
total = sum(skills)
reachable = {0}
for s in skills:
    reachable |= {r + s for r in reachable}
return min(abs(total - 2 * r) for r in reachable)
''', '''
a = b = 0
for s in skills:
    if a <= b:
        a += s
    else:
        b += s
return abs(a - b)
''', '''
assert balanced_teams([1, 6, 11, 5]) == 1
assert balanced_teams([]) == 0
assert balanced_teams([7]) == 7
assert balanced_teams([3, 1, 4, 2, 2]) == 0
assert balanced_teams([10, 10, 9, 9, 2]) == 0
''')

problem("algorithms", '''
def topological_order(deps: dict[str, list[str]]) -> list[str]:
    """Order tasks so that every task comes after the tasks it depends on. deps maps each
    task to the tasks it needs first (every task appears as a key). When several tasks are
    ready at once, take them in alphabetical order. If the dependencies have a cycle,
    return an empty list.
    >>> topological_order({"b": ["a"], "a": [], "c": ["a", "b"]})
    ['a', 'b', 'c']
    """
''', '''
remaining = {t: set(d) for t, d in deps.items()}
order = []
while remaining:
    ready = sorted(t for t, d in remaining.items() if not d)
    if not ready:
        return []
    t = ready[0]
    order.append(t)
    del remaining[t]
    for d in remaining.values():
        d.discard(t)
return order
''', '''
order = []
for t in sorted(deps, key=lambda t: len(deps[t])):
    order.append(t)
return order
''', '''
assert topological_order({"b": ["a"], "a": [], "c": ["a", "b"]}) == ["a", "b", "c"]
assert topological_order({}) == []
assert topological_order({"x": ["y"], "y": ["x"]}) == []
assert topological_order({"d": [], "c": [], "b": ["d"], "a": ["c"]}) == ["c", "a", "d", "b"]
assert topological_order({"z": [], "m": ["z"], "a": ["m"]}) == ["z", "m", "a"]
''')


def check_examples():
    """The >>> examples of every docstring hold for the reference solution (our own
    code, run in this process; the sandboxed checks are in tests/test_code_eval.cpp)."""
    bad = []
    for p in P:
        ns = {}
        exec(p["prompt"] + p["canonical_solution"], ns)
        runner = doctest.DocTestRunner(verbose=False)
        for t in doctest.DocTestFinder().find(ns[p["entry_point"]], globs=ns):
            runner.run(t, out=lambda s: None)
        if runner.failures or not runner.tries:
            bad.append(p["id"])
    return bad


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "problems.jsonl")
    text = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in P)
    bad = check_examples()
    if bad:
        sys.exit("docstring examples that the reference solution does not reproduce: " + ", ".join(bad))
    if "--check" in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit("problems.jsonl is out of date: run tests/data/code/make_problems.py")
        print("problems.jsonl matches make_problems.py (%d problems, docstring examples hold)" % len(P))
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print("wrote %d problems to %s" % (len(P), path))


if __name__ == "__main__":
    main()
