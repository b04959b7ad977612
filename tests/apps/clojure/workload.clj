;; A CPU-bound Clojure program for the real-application corpus of tests/tests/real_apps/, run
;; by Debian's Clojure 1.11 (`java -cp clojure.jar clojure.main workload.clj SECONDS`). It does
;; what Clojure programs spend their time on: persistent and transient collections, lazy
;; sequences, reducers over maps, protocol and multimethod dispatch, regular expressions and
;; strings, sorting, recursion, and reflective Java interop (no type hints). Two threads work
;; (the main thread and a future on Clojure's agent pool) until SECONDS have passed.
(ns workload
  (:require [clojure.string :as str]))

(defprotocol Shape
  (area [shape])
  (scale [shape factor]))

(defrecord Circle [r]
  Shape
  (area [_] (* Math/PI r r))
  (scale [_ f] (->Circle (* r f))))

(defrecord Rect [w h]
  Shape
  (area [_] (* w h))
  (scale [_ f] (->Rect (* w f) (* h f))))

(defrecord Triangle [b h]
  Shape
  (area [_] (/ (* b h) 2.0))
  (scale [_ f] (->Triangle (* b f) (* h f))))

(defmulti describe (fn [shape] (class shape)))
(defmethod describe Circle [s] (str "circle " (:r s)))
(defmethod describe Rect [s] (str "rect " (:w s) "x" (:h s)))
(defmethod describe :default [s] (str "shape " (area s)))

(defn lcg [^long seed]
  (unchecked-add (unchecked-multiply seed 6364136223846793005) 1442695040888963407))

(defn shapes [n seed]
  (loop [i 0 seed seed acc (transient [])]
    (if (< i n)
      (let [s (lcg seed)
            k (mod (bit-shift-right s 33) 3)
            a (double (inc (mod (bit-shift-right s 20) 100)))
            b (double (inc (mod (bit-shift-right s 40) 50)))]
        (recur (inc i) s (conj! acc (case (int k) 0 (->Circle a) 1 (->Rect a b) (->Triangle a b)))))
      (persistent! acc))))

(defn geometry [seed]
  (let [xs (shapes 3000 seed)
        scaled (map #(scale % 1.5) xs)
        by-kind (group-by class scaled)
        totals (into {} (for [[k v] by-kind] [k (reduce + (map area v))]))
        labels (frequencies (map #(first (str/split (describe %) #" ")) xs))]
    [(count totals) labels]))

(def words ["alpha" "beta" "gamma" "delta" "clojure" "lisp" "stack" "frame"
            "thread" "queue" "vector" "map" "seq" "lazy" "persistent" "atom"])

(defn text [n seed]
  (loop [i 0 seed seed sb (StringBuilder.)]
    (if (< i n)
      (let [s (lcg seed)]
        (.append sb (nth words (mod (bit-shift-right s 33) (count words))))
        (.append sb (if (zero? (mod i 11)) ". " " "))
        (recur (inc i) s sb))
      (.toString sb))))

(defn word-stats [seed]
  (let [t (text 4000 seed)
        sentences (str/split t #"\.\s*")
        tokens (mapcat #(re-seq #"[a-z]+" %) sentences)
        freq (frequencies tokens)
        top (take 5 (sort-by (comp - val) freq))
        pairs (frequencies (partition 2 1 tokens))
        ;; Reflective interop: no type hints, so Clojure's Reflector finds the method each call.
        lengths (reduce + (map (fn [w] (.length w)) (keys freq)))
        upper (count (filter (fn [s] (.startsWith (str/upper-case s) "S")) sentences))]
    [top (count pairs) lengths upper]))

(defn fib [n]
  (if (< n 2) n (+ (fib (- n 1)) (fib (- n 2)))))

(defn tree-insert [tree k]
  (cond
    (nil? tree) {:k k :l nil :r nil}
    (< k (:k tree)) (assoc tree :l (tree-insert (:l tree) k))
    :else (assoc tree :r (tree-insert (:r tree) k))))

(defn tree-depth [tree]
  (if (nil? tree) 0 (inc (max (tree-depth (:l tree)) (tree-depth (:r tree))))))

(defn recursion [seed]
  (let [keys (take 1500 (iterate lcg seed))
        tree (reduce tree-insert nil (map #(mod % 100000) keys))]
    [(fib 22) (tree-depth tree)]))

(defn sorting [seed]
  (let [records (vec (for [x (take 6000 (iterate lcg seed))]
                       {:id (mod x 1000) :score (mod (bit-shift-right x 17) 977) :name (str "n" (mod x 97))}))
        sorted (sort-by (juxt :score :name) records)
        grouped (reduce (fn [m r] (update m (:name r) (fnil + 0) (:score r))) {} sorted)
        sset (into (sorted-set) (map :id records))]
    [(count grouped) (first sset) (:id (first sorted))]))

(defn round [seed]
  [(geometry seed) (word-stats seed) (recursion seed) (sorting seed)])

(defn work-until [deadline seed]
  (loop [seed seed rounds 0]
    (if (< (System/currentTimeMillis) deadline)
      (do (round seed) (recur (lcg seed) (inc rounds)))
      rounds)))

(let [seconds (Long/parseLong (or (first *command-line-args*) "30"))
      deadline (+ (System/currentTimeMillis) (* 1000 seconds))
      other (future (work-until deadline 12345))]
  (println "ready")
  (flush)
  (let [mine (work-until deadline 777)]
    (println "rounds" mine @other)
    (shutdown-agents)))
