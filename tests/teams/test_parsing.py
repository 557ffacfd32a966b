from searchteam.methods.mask.team import parse_plan
from searchteam.teams.parsing import (
    MAX_PARSE_CHARS,
    capped,
    parse_answer,
    small_int,
    tag_contents,
    tag_pairs,
    untagged,
)


def test_answer_tag_last_one_wins():
    parsed = parse_answer("<answer>x</answer> hmm <answer> Paris </answer>")
    assert parsed.ok and parsed.value == "Paris"


def test_unclosed_tag_is_format_error_with_fallback():
    parsed = parse_answer("<answer>Thomas Mann. He wrote novels")
    assert not parsed.ok and parsed.value == "Thomas Mann" and "unclosed" in parsed.error


def test_missing_tag_falls_back_to_first_line():
    parsed = parse_answer("Answer: Frankie Valli\nmore text")
    assert not parsed.ok and parsed.value == "Frankie Valli"


def test_empty_output():
    parsed = parse_answer("   ")
    assert not parsed.ok and parsed.value == "" and parsed.error == "empty output"


def test_tag_contents_case_insensitive_multiline():
    assert tag_contents("<Search>a\nb</Search><search>c</search>", "search") == ["a\nb", "c"]


def test_tag_pairs_skip_unclosed_openings_and_never_overlap():
    text = "<search>lost <Search>a</SEARCH> <answer>b<search>c</search></answer>"
    pairs = [(p.name, p.content) for p in tag_pairs(text, ("search", "answer"))]
    assert pairs == [("search", "lost <Search>a"), ("answer", "b<search>c</search>")]


def test_numbered_tags_close_only_with_their_own_number():
    pairs = tag_pairs("<q1>a</q12><q12>b</q12></q1>", ("q",), numbered=True)
    assert [(p.number, p.content) for p in pairs] == [("1", "a</q12><q12>b</q12>")]


def test_untagged_keeps_a_lone_angle_bracket():
    assert untagged("a <b> c <> d < e") == "a   c <> d < e"


def test_parsers_read_only_the_capped_prefix():
    assert capped("x" * (MAX_PARSE_CHARS + 5)) == "x" * MAX_PARSE_CHARS
    late = "x" * MAX_PARSE_CHARS + "<answer>late</answer>"
    assert parse_answer(late).error == "missing <answer> tag"


def test_long_digit_runs_are_no_number():
    assert small_int("123456789") == 123456789 and small_int("1" * 5000) is None


def test_plan_with_many_unclosed_sub_questions_still_parses():
    plan = parse_plan("<q1>" * 20_000 + "<q2>B?</q2><a2>Mann</a2>", "Q?")
    assert [(s.query, s.answer) for s in plan.state.trajectory] == [("B?", "Mann")]
    assert plan.state.predicted_answer == "Mann" and plan.errors == ["missing <predicted_answer>"]
