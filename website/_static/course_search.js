/* The course's ranking and excerpts for Sphinx's search page (website/search.py says why).
 *
 * Loaded on search.html only, with course_search_data.js (COURSE_SEARCH: per page, its prose
 * term counts and the stems of its title, headings and course-map line). Sphinx finds the
 * pages holding every query term; this file re-scores them and writes their excerpts. */
"use strict";

const CourseSearch = {
  // BM25's usual constants: how fast repeated terms saturate, how much page length counts
  k1: 1.2,
  b: 0.75,
  // a heading that holds a query term counts as this many occurrences of it in the prose
  headingWeight: 3,
  // the whole query as a phrase of the course map's line for a lesson, its title, a heading
  phraseBonus: { teaches: 12, title: 6, heading: 3 },
  // a concept is taught in a lesson, exercised in an exercise, listed in the API
  sectionWeight: { "lessons/": 1.0, "docs/": 0.8, "exercises/": 0.7, "api/": 0.6 },
  otherWeight: 0.8,

  query: null,    // {terms: stems (stop words dropped), phrase: stems of every word, words: as typed}
  cache: new Map(),

  setQuery(text) {
    const stemmer = new Stemmer();
    const stem = (w) => stemmer.stemWord(w.toLowerCase());
    const all = splitQuery(text.trim());
    CourseSearch.query = {
      terms: [...new Set(all.filter((w) => !stopwords.has(w.toLowerCase())).map(stem))],
      phrase: all.map(stem),
      words: all.map((w) => w.toLowerCase()),
    };
    CourseSearch.cache = new Map();
  },

  holdsPhrase(stems, phrase) {
    if (!phrase.length || stems.length < phrase.length) return false;
    for (let i = 0; i + phrase.length <= stems.length; i++)
      if (phrase.every((p, j) => stems[i + j] === p)) return true;
    return false;
  },

  weightOf(docname) {
    const section = Object.keys(CourseSearch.sectionWeight).find((s) => docname.startsWith(s));
    return section ? CourseSearch.sectionWeight[section] : CourseSearch.otherWeight;
  },

  pageScore(docname) {
    if (CourseSearch.cache.has(docname)) return CourseSearch.cache.get(docname);
    const pages = Object.values(COURSE_SEARCH);
    const page = COURSE_SEARCH[docname];
    let score = 0;
    if (page && CourseSearch.query) {
      const { terms, phrase } = CourseSearch.query;
      const average = pages.reduce((s, p) => s + p.length, 0) / pages.length;
      const frequency = (p, t) =>
        (p.counts[t] || 0) + CourseSearch.headingWeight *
          [p.title, ...p.headings].reduce((n, h) => n + h.filter((s) => s === t).length, 0);
      for (const term of terms) {
        const holding = pages.filter((p) => frequency(p, term) > 0).length;
        const idf = Math.log(1 + (pages.length - holding + 0.5) / (holding + 0.5));
        const f = frequency(page, term);
        const norm = CourseSearch.k1 * (1 - CourseSearch.b + (CourseSearch.b * page.length) / average);
        score += (idf * f * (CourseSearch.k1 + 1)) / (f + norm);
      }
      const bonus = CourseSearch.phraseBonus;
      if (CourseSearch.holdsPhrase(page.teaches, phrase)) score += bonus.teaches;
      if (CourseSearch.holdsPhrase(page.title, phrase)) score += bonus.title;
      if (page.headings.some((h) => CourseSearch.holdsPhrase(h, phrase))) score += bonus.heading;
      score *= CourseSearch.weightOf(docname);
    }
    CourseSearch.cache.set(docname, score);
    return score;
  },

  // Scorer.score: [docname, title, anchor, descr, score, filename, kind] -> the new score
  score(result) {
    const [docname, name, anchor, , score, , kind] = result;
    // an API name: Sphinx's own score where a query word is the name (or its last dotted part),
    // a quarter of it where the name merely contains one ("sequence" in in_flight_sequences)
    if (kind === "object") {
      const full = name.toLowerCase();
      const named = CourseSearch.query.words.some((w) => w === full || w === full.split(".").pop());
      return named ? score : score / 4;
    }
    const page = CourseSearch.pageScore(docname);
    return anchor ? page - 0.01 : page;    // a section of a page right after the page itself
  },

  // --- the excerpt: the sentence that holds the query, from the article only --------------

  matchLevel(text, keywords, phraseText) {
    const lower = text.toLowerCase().replace(/\s+/g, " ");
    if (phraseText && lower.includes(phraseText)) return 3;
    const found = keywords.filter((k) => lower.includes(k)).length;
    return found === keywords.length && found ? 2 : found ? 1 : 0;
  },

  summary(htmlText, keywords, anchor) {
    const doc = new DOMParser().parseFromString(htmlText, "text/html");
    const article = doc.querySelector("article.bd-article") || doc.querySelector('[role="main"]');
    if (!article) return null;
    const root = (anchor && article.querySelector(anchor)) || article;
    root.querySelectorAll(".headerlink, script, style, .cell_output, button").forEach((e) => e.remove());
    const phraseText = (Search._courseQuery || "").toLowerCase().trim().replace(/\s+/g, " ");
    const stems = [...keywords].map((k) => k.toLowerCase());
    // sentences first, then headings (not the page's title: the result shows it), then code
    const prose = [...root.querySelectorAll("p, li, dt, dd, td, th, figcaption")]
      .filter((e) => !e.closest("pre") && !e.querySelector("p, li"));
    const headings = [...root.querySelectorAll("h2, h3, h4")];
    const code = [...root.querySelectorAll("pre")];
    let best = null, bestLevel = 0;
    for (const block of [...prose, ...headings, ...code]) {   // on a tie, the earlier kind wins
      const level = CourseSearch.matchLevel(block.textContent, stems, phraseText);
      if (level > bestLevel) [best, bestLevel] = [block, level];
      if (level === 3) break;
    }
    if (!best) return null;
    // the math's TeX as typed, without MathJax's delimiters: \(2(p-1)\) reads 2(p-1)
    const text = best.textContent.replace(/\\[()[\]]/g, "").replace(/\s+/g, " ").trim();
    const sentences = text.split(/(?<=[.!?:;])\s+(?=[A-Z(])/);   // a stop, then a capital
    const sentence = sentences.find((s) => CourseSearch.matchLevel(s, stems, phraseText) === bestLevel) || text;
    const lower = sentence.toLowerCase();
    const at = Math.max(0, Math.min(...[phraseText, ...stems].map((k) => lower.indexOf(k)).filter((i) => i >= 0)));
    const start = sentence.length <= 240 ? 0 : Math.max(0, at - 80);
    const excerpt = document.createElement("p");
    excerpt.classList.add("context");
    excerpt.textContent = (start ? "..." : "") + sentence.substr(start, 240).trim() +
      (start + 240 < sentence.length ? "..." : "");
    return excerpt;
  },

  install() {
    const parse = Search._parseQuery;
    Search._parseQuery = (query) => {
      CourseSearch.setQuery(query);
      Search._courseQuery = query;
      return parse(query);
    };
    Scorer.score = CourseSearch.score;
    Search.makeSearchSummary = CourseSearch.summary;
  },
};

if (typeof Search !== "undefined") CourseSearch.install();
else document.addEventListener("DOMContentLoaded", CourseSearch.install);
