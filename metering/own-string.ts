// A string kept in a long-lived map must not keep a larger one alive. V8 makes a slice of 13 or
// more characters a view into the string it was cut from, so a word memoised from a request's
// text held the whole text (a 256 KB message for one new 20-character word) for as long as the
// memo kept the word: 100 MB for 400 such words, measured.

/** `s` as a string of its own, not a view into a larger one (a flat copy; short strings as they are). */
export function ownString(s: string): string {
  // Joining flattens into a new string of s.length + 1 characters; the slice of it keeps only that.
  return s.length < 13 ? s : (' ' + s).slice(1);
}
